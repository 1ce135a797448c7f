// Package testimage builds the instance test image (`make testimage`,
// docs/instance-runtime.md): a raw squashfs whose /sbin/init, a busybox
// shell script, starts busybox httpd on port 8080 serving a page with the
// host name and the first line of the instance's user data. It is built
// from Debian's busybox-static with squashfs-tools' mksquashfs, from
// nothing downloaded.
package testimage

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// DefaultBusybox is busybox-static's binary.
const DefaultBusybox = "/bin/busybox"

// Port is where the image's httpd listens.
const Port = 8080

// Marker starts the page the image serves, then "<hostname>\n", then
// "user-data: <first line>\n".
const Marker = "better-compute test image on "

// Init is the image's /sbin/init.
const Init = `#!/bin/sh
# The instance test image's init: a page with the host name and the user
# data's first line on :8080, until SIGTERM.
ud=/var/lib/cloud/seed/nocloud/user-data
first=""
[ -r "$ud" ] && first=$(head -n 1 "$ud")
mkdir -p /run/www
printf '` + Marker + `%s\nuser-data: %s\n' "$(hostname)" "$first" > /run/www/index.html
httpd -f -p 8080 -h /run/www &
echo "test image: httpd on :8080"
trap 'kill $! 2>/dev/null; exit 0' TERM INT
wait
`

// applets are the busybox links the image has.
var applets = []string{"sh", "httpd", "hostname", "head", "mkdir", "printf", "cat", "kill", "sleep", "ls", "ps", "ip", "wget"}

// Build writes the image to out; busybox is the static busybox to put in
// it ("" for DefaultBusybox).
func Build(ctx context.Context, busybox, out string) error {
	if busybox == "" {
		busybox = DefaultBusybox
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("testimage: %w (Debian package busybox-static)", err)
	}
	root, err := os.MkdirTemp(filepath.Dir(out), ".testimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	for _, d := range []string{"bin", "sbin", "proc", "sys", "dev", "run", "tmp", "etc", "var/lib/cloud"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		return err
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "sbin/init"), []byte(Init), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644); err != nil {
		return err
	}
	_ = os.Remove(out)
	cmd := exec.CommandContext(ctx, "mksquashfs", root, out, "-noappend", "-all-root", "-no-xattrs", "-quiet",
		"-mkfs-time", "0", "-all-time", "0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testimage: mksquashfs (Debian package squashfs-tools): %w: %s", err, bytes.TrimSpace(b))
	}
	return nil
}
