//go:build !linux

package ramdisk

import "errors"

var errNotLinux = errors.New("the ramdisk runs on Linux only")

func wipeDisk(dev, sys, name string) (int, error) { return 0, errNotLinux }

func powerOff() error { return errNotLinux }

func reboot() error { return errNotLinux }

type blockDisk struct{ fileDisk }

func openBlockDisk(string) (*blockDisk, error) { return nil, errNotLinux }
