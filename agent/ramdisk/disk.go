package ramdisk

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/diskfs/go-diskfs/backend"
)

// Disk is one of the machine's disks opened for the deploy steps: the raw
// bytes from offset 0 to Size.
type Disk interface {
	io.ReaderAt
	io.WriterAt
	// Size is the disk's size in bytes.
	Size() int64
	// Sync makes what was written durable and, on a block device, makes the
	// kernel re-read the partition table.
	Sync() error
	Close() error
}

// fileDisk is a simulated machine's disk: a file, optionally written no
// faster than a rate, so a test can act while an image is being written.
type fileDisk struct {
	f    *os.File
	size int64
	// bytesPerSecond > 0 limits WriteAt.
	bytesPerSecond int64
}

func openFileDisk(path string, bytesPerSecond int64) (*fileDisk, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fileDisk{f: f, size: st.Size(), bytesPerSecond: bytesPerSecond}, nil
}

func (d *fileDisk) ReadAt(p []byte, off int64) (int, error) { return d.f.ReadAt(p, off) }

func (d *fileDisk) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > d.size {
		return 0, fmt.Errorf("write of %d bytes at %d past the disk's end (%d bytes)", len(p), off, d.size)
	}
	if d.bytesPerSecond > 0 {
		// A simulated disk's speed: the caller checks its context between
		// writes, so a slow disk stays interruptible.
		time.Sleep(time.Duration(int64(len(p)) * int64(time.Second) / d.bytesPerSecond))
	}
	return d.f.WriteAt(p, off)
}

func (d *fileDisk) Size() int64  { return d.size }
func (d *fileDisk) Sync() error  { return d.f.Sync() }
func (d *fileDisk) Close() error { return d.f.Close() }

// diskStorage presents a Disk to go-diskfs as a regular file of the disk's
// size, so the library reads and writes the partition table and the
// filesystem through the Disk (and its Sync) rather than opening the device
// itself.
type diskStorage struct {
	d   Disk
	off int64
}

var _ backend.Storage = (*diskStorage)(nil)
var _ backend.WritableFile = (*diskStorage)(nil)

func (s *diskStorage) Stat() (fs.FileInfo, error) { return diskInfo{size: s.d.Size()}, nil }

func (s *diskStorage) Read(p []byte) (int, error) {
	n, err := s.d.ReadAt(p, s.off)
	s.off += int64(n)
	return n, err
}

func (s *diskStorage) ReadAt(p []byte, off int64) (int, error)  { return s.d.ReadAt(p, off) }
func (s *diskStorage) WriteAt(p []byte, off int64) (int, error) { return s.d.WriteAt(p, off) }

func (s *diskStorage) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += s.off
	case io.SeekEnd:
		offset += s.d.Size()
	default:
		return 0, errors.New("seek: invalid whence")
	}
	if offset < 0 {
		return 0, errors.New("seek: negative offset")
	}
	s.off = offset
	return offset, nil
}

// Close leaves the Disk open: its owner closes it.
func (s *diskStorage) Close() error                            { return nil }
func (s *diskStorage) Sys() (*os.File, error)                  { return nil, backend.ErrNotSuitable }
func (s *diskStorage) Writable() (backend.WritableFile, error) { return s, nil }
func (s *diskStorage) Path() string                            { return "" }

// diskInfo is the FileInfo of a diskStorage: a regular file of the disk's
// size.
type diskInfo struct{ size int64 }

func (i diskInfo) Name() string       { return "disk" }
func (i diskInfo) Size() int64        { return i.size }
func (i diskInfo) Mode() fs.FileMode  { return 0o600 }
func (i diskInfo) ModTime() time.Time { return time.Time{} }
func (i diskInfo) IsDir() bool        { return false }
func (i diskInfo) Sys() any           { return nil }
