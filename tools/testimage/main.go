// Command testimage writes the instance test image (`make testimage`): a
// raw squashfs whose init serves the host name and the user data's first
// line over HTTP on port 8080 (agent/runtime/testimage).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/better-compute/agent/runtime/testimage"
)

func main() {
	out := flag.String("out", "bin/testimage/image.squashfs", "the image to write")
	busybox := flag.String("busybox", testimage.DefaultBusybox, "the static busybox to put in it")
	flag.Parse()
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "testimage:", err)
		os.Exit(1)
	}
	if err := testimage.Build(context.Background(), *busybox, *out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("testimage:", *out)
}
