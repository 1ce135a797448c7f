package ramdisk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	dfsdisk "github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/better-compute/better-compute/agent/protocol"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

const (
	// imageTries is how many times in a row an image download may fail
	// without bringing a byte before write-image gives up.
	imageTries = 5
	// imageChunk is how much is read from the network and written to the
	// disk at once.
	imageChunk = 1 << 20
	// spoilSpan is how much of a disk's start a failed write-image zeroes:
	// the MBR, the primary GPT and a boot loader's first stage, so the
	// firmware finds nothing to boot.
	spoilSpan = 1 << 20
	// seedSize is the NoCloud seed partition's size: FAT16 needs a few
	// MiB, and user data rarely passes a few KiB.
	seedSize = 8 << 20
	// partAlign aligns partitions to 1 MiB, as partitioning tools do.
	partAlign = 1 << 20
	// execOutputMax bounds the output an exec step keeps in its result.
	execOutputMax = 4 << 10
	// defaultExecTimeout is an exec step's timeout without timeoutSeconds.
	defaultExecTimeout = 10 * time.Minute
)

// chooseDisk picks the disk a deploy step acts on: the one hint names (its
// name, /dev/<name>, serial or WWN), else the smallest that holds need
// bytes (Ironic's default). The system disk is never chosen.
func chooseDisk(disks []coreinv.Disk, hint string, need int64) (coreinv.Disk, error) {
	var names []string
	for _, d := range disks {
		names = append(names, fmt.Sprintf("%s (%d bytes)", d.Name, d.SizeBytes))
	}
	have := strings.Join(names, ", ")
	if have == "" {
		have = "none"
	}
	if hint != "" {
		name := strings.TrimPrefix(hint, "/dev/")
		for _, d := range disks {
			if d.Name != name && (d.Serial == "" || d.Serial != hint) && (d.WWN == "" || d.WWN != hint) {
				continue
			}
			switch {
			case d.System:
				return coreinv.Disk{}, fmt.Errorf("rootDevice %q is the system disk", hint)
			case d.SizeBytes < need:
				return coreinv.Disk{}, fmt.Errorf("rootDevice %q (%d bytes) cannot hold %d bytes", hint, d.SizeBytes, need)
			}
			return d, nil
		}
		return coreinv.Disk{}, fmt.Errorf("rootDevice %q matches no disk (disks: %s)", hint, have)
	}
	var best *coreinv.Disk
	for i, d := range disks {
		if d.System || d.SizeBytes < need {
			continue
		}
		if best == nil || d.SizeBytes < best.SizeBytes || (d.SizeBytes == best.SizeBytes && d.Name < best.Name) {
			best = &disks[i]
		}
	}
	if best == nil {
		return coreinv.Disk{}, fmt.Errorf("no disk holds %d bytes (disks: %s)", need, have)
	}
	return *best, nil
}

// neededBytes is the room a disk must have for an image of size bytes and
// a minSizeBytes hint ("" for none).
func neededBytes(size int64, minSize string) (int64, error) {
	if minSize == "" {
		return size, nil
	}
	m, err := strconv.ParseInt(minSize, 10, 64)
	if err != nil || m < 0 {
		return 0, fmt.Errorf("minSizeBytes %q is not an integer", minSize)
	}
	return max(size, m), nil
}

// writeImage is the write-image step: it streams args["url"] into the
// chosen disk, hashing and counting as it writes, resuming an interrupted
// download with a Range request, and checks the digest and size at the end.
// Any failure once the disk is open zeroes the disk's first MiB, so nothing
// boots from a partial or tampered image.
func (a *Agent) writeImage(ctx context.Context, inv *coreinv.NodeInventory, args map[string]string) (string, error) {
	url := args["url"]
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return "", fmt.Errorf("write-image: url %q is not http(s)", url)
	}
	want := strings.ToLower(args["sha256"])
	if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("write-image: sha256 %q is not a SHA-256 in hex", args["sha256"])
	}
	size, err := strconv.ParseInt(args["sizeBytes"], 10, 64)
	if err != nil || size <= 0 {
		return "", fmt.Errorf("write-image: sizeBytes %q is not a positive integer", args["sizeBytes"])
	}
	need, err := neededBytes(size, args["minSizeBytes"])
	if err != nil {
		return "", fmt.Errorf("write-image: %w", err)
	}
	d, err := chooseDisk(inv.Disks, args["rootDevice"], need)
	if err != nil {
		return "", fmt.Errorf("write-image: %w", err)
	}
	disk, err := a.Machine.OpenDisk(ctx, d)
	if err != nil {
		return "", fmt.Errorf("write-image: %w", err)
	}
	defer disk.Close()
	if disk.Size() < size {
		return "", fmt.Errorf("write-image: %s is %d bytes, the image %d", d.Name, disk.Size(), size)
	}
	a.log().Info("writing image", "disk", d.Name, "sizeBytes", size, "sha256", want)
	start := time.Now()
	got, n, err := a.streamImage(ctx, disk, url, size, func(written int64) {
		a.log().Info("writing image", "disk", d.Name, "percent", written*100/size, "bytes", written)
	})
	if err == nil && (n != size || got != want) {
		err = fmt.Errorf("the image's sha256 is %s (%d bytes), want %s (%d bytes)", got, n, want, size)
	}
	if err == nil {
		if err = disk.Sync(); err != nil {
			err = fmt.Errorf("sync: %w", err)
		}
	}
	if err != nil {
		a.spoil(disk, d.Name)
		return "", fmt.Errorf("write-image to %s: %w", d.Name, err)
	}
	a.imageDisk = d.Name
	secs := time.Since(start).Seconds()
	return fmt.Sprintf("wrote %d bytes (sha256 %s) to %s in %.1f s (%.1f MiB/s)",
		n, got, d.Name, secs, float64(n)/(1<<20)/max(secs, 0.001)), nil
}

// spoil zeroes the disk's first MiB after a failed write.
func (a *Agent) spoil(disk Disk, name string) {
	zeros := make([]byte, min(spoilSpan, disk.Size()))
	_, err := disk.WriteAt(zeros, 0)
	if err == nil {
		err = disk.Sync()
	}
	if err != nil {
		a.log().Error("could not zero the start of the disk after a failed write", "disk", name, "error", err.Error())
		return
	}
	a.log().Warn("zeroed the start of the disk after a failed write", "disk", name, "bytes", len(zeros))
}

// streamImage downloads url into w from offset 0, resuming from the last
// byte written after a dropped connection, and answers the SHA-256 and the
// count of the bytes written. progress hears about every tenth of size.
func (a *Agent) streamImage(ctx context.Context, w io.WriterAt, url string, size int64, progress func(int64)) (string, int64, error) {
	client := a.Client
	if client == nil {
		// No overall timeout: an image takes as long as it takes; a
		// stalled connection is the transport's and the context's to end.
		client = &http.Client{}
	}
	minD, maxD := a.backoff()
	s := &imageStream{
		w: w, h: sha256.New(), size: size, buf: make([]byte, imageChunk),
		token: a.Config.Token, progress: progress, nextReport: size / 10,
	}
	delay := minD
	fails := 0
	for s.written < size {
		before := s.written
		retry, err := s.fetch(ctx, client, url)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return "", s.written, ctx.Err()
		}
		if !retry {
			return "", s.written, err
		}
		if s.written > before {
			fails, delay = 0, minD
		}
		fails++
		if fails >= imageTries {
			return "", s.written, fmt.Errorf("download failed %d times at byte %d: %w", fails, s.written, err)
		}
		a.log().Warn("image download interrupted, resuming", "at", s.written, "try", fails, "error", err.Error(), "in", delay.String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", s.written, ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, maxD)
	}
	return hex.EncodeToString(s.h.Sum(nil)), s.written, nil
}

// imageStream is one image download in progress.
type imageStream struct {
	w          io.WriterAt
	h          hash.Hash
	size       int64
	written    int64
	buf        []byte
	token      string
	progress   func(int64)
	nextReport int64
}

// fetch GETs the rest of the image (all of it, or a Range from the last
// byte written) and writes it. retry says whether trying again may help.
func (s *imageStream) fetch(ctx context.Context, client *http.Client, url string) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	if s.written > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", s.written))
	}
	resp, err := client.Do(req)
	if err != nil {
		return true, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		if s.written > 0 {
			// The server ignored the Range: start over.
			s.h.Reset()
			s.written = 0
			s.nextReport = s.size / 10
		}
	case resp.StatusCode == http.StatusPartialContent:
		if !strings.HasPrefix(resp.Header.Get("Content-Range"), fmt.Sprintf("bytes %d-", s.written)) {
			return false, fmt.Errorf("asked for bytes %d-, got Content-Range %q", s.written, resp.Header.Get("Content-Range"))
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return false, fmt.Errorf("the image ends before byte %d (want %d bytes)", s.written, s.size)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, fmt.Errorf("GET image: %s", resp.Status)
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return false, fmt.Errorf("GET image: %s: %s", resp.Status, snippet(b))
	}
	body := io.LimitReader(resp.Body, s.size-s.written)
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		n, rerr := io.ReadFull(body, s.buf)
		if n > 0 {
			if _, err := s.w.WriteAt(s.buf[:n], s.written); err != nil {
				return false, fmt.Errorf("write at byte %d: %w", s.written, err)
			}
			s.h.Write(s.buf[:n])
			s.written += int64(n)
			if s.written >= s.nextReport || s.written == s.size {
				s.progress(s.written)
				s.nextReport = s.written + s.size/10
			}
		}
		switch {
		case s.written == s.size:
			return false, nil
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return true, fmt.Errorf("the connection ended at byte %d of %d", s.written, s.size)
		case rerr != nil:
			return true, rerr
		}
	}
}

// seedFile is one file of the NoCloud seed.
type seedFile struct {
	name    string
	content []byte
}

// writeSeed is the write-seed step: it fetches the workflow's NoCloud seed
// and writes it, with the re-join config, as a FAT partition labelled
// SeedLabel after the image's last partition.
func (a *Agent) writeSeed(ctx context.Context, inv *coreinv.NodeInventory, args map[string]string) (string, error) {
	var d coreinv.Disk
	switch {
	case args["rootDevice"] != "":
		var err error
		if d, err = chooseDisk(inv.Disks, args["rootDevice"], 0); err != nil {
			return "", fmt.Errorf("write-seed: %w", err)
		}
	case a.imageDisk != "":
		i := slices.IndexFunc(inv.Disks, func(x coreinv.Disk) bool { return x.Name == a.imageDisk })
		if i < 0 {
			return "", fmt.Errorf("write-seed: disk %s is gone from the inventory", a.imageDisk)
		}
		d = inv.Disks[i]
	case args["sizeBytes"] != "":
		// A seed written again in a later boot (a retried workflow): the
		// disk write-image's own rule picks for an image of that size.
		size, err := strconv.ParseInt(args["sizeBytes"], 10, 64)
		if err != nil || size <= 0 {
			return "", fmt.Errorf("write-seed: sizeBytes %q is not a positive integer", args["sizeBytes"])
		}
		need, err := neededBytes(size, args["minSizeBytes"])
		if err != nil {
			return "", fmt.Errorf("write-seed: %w", err)
		}
		if d, err = chooseDisk(inv.Disks, "", need); err != nil {
			return "", fmt.Errorf("write-seed: %w", err)
		}
	default:
		return "", errors.New("write-seed: no disk: write-image has not written one in this boot and args name neither rootDevice nor sizeBytes")
	}
	var seed protocol.RamdiskSeed
	if err := a.post(ctx, protocol.RamdiskSeedPath, protocol.RamdiskSeedRequest{Token: a.Config.Token}, &seed); err != nil {
		return "", fmt.Errorf("write-seed: %w", err)
	}
	join := protocol.SeedJoin{
		APIURL: a.Config.APIURL, Token: a.Config.Token,
		NodeID: firstNonEmpty(seed.NodeID, a.nodeID), AgentEndpoint: a.Config.AgentEndpoint,
	}
	joinJSON, err := json.MarshalIndent(join, "", "  ")
	if err != nil {
		return "", fmt.Errorf("write-seed: %w", err)
	}
	files := []seedFile{{"meta-data", []byte(seed.MetaData)}}
	if seed.UserData != "" {
		files = append(files, seedFile{"user-data", []byte(seed.UserData)})
	}
	if seed.NetworkConfig != "" {
		files = append(files, seedFile{"network-config", []byte(seed.NetworkConfig)})
	}
	files = append(files, seedFile{protocol.SeedJoinFile, append(joinJSON, '\n')})
	disk, err := a.Machine.OpenDisk(ctx, d)
	if err != nil {
		return "", fmt.Errorf("write-seed: %w", err)
	}
	defer disk.Close()
	where, err := writeSeedPartition(disk, files)
	if err != nil {
		return "", fmt.Errorf("write-seed to %s: %w", d.Name, err)
	}
	if err := disk.Sync(); err != nil {
		return "", fmt.Errorf("write-seed to %s: sync: %w", d.Name, err)
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.name
	}
	return fmt.Sprintf("wrote the NoCloud seed (%s) to %s, %s", strings.Join(names, ", "), d.Name, where), nil
}

// writeSeedPartition adds a FAT16 partition labelled SeedLabel at the end
// of the free space after the last partition of the disk's MBR or GPT
// (at the end, so the image's root partition can still grow into the
// space before it), and writes files into it. It says where.
func writeSeedPartition(disk Disk, files []seedFile) (string, error) {
	dd, err := diskfs.OpenBackend(&diskStorage{d: disk})
	if err != nil {
		return "", err
	}
	table, err := dd.GetPartitionTable()
	if err != nil {
		return "", errors.New("the image has no partition table (MBR or GPT) to add the seed partition to")
	}
	const sector = 512
	var index int
	var start, count uint64 // in sectors
	switch t := table.(type) {
	case *mbr.Table:
		slot := -1
		var end uint64
		for i, p := range t.Partitions {
			if p.Type == mbr.Empty && p.Size == 0 {
				if slot < 0 {
					slot = i
				}
				continue
			}
			end = max(end, uint64(p.Start)+uint64(p.Size))
		}
		if slot < 0 {
			return "", errors.New("the image's MBR has no free entry for the seed partition")
		}
		// An MBR addresses 2^32 sectors.
		start, count, err = seedPlace(end, min(uint64(disk.Size()/sector), 1<<32-1))
		if err != nil {
			return "", err
		}
		index = slot + 1
		t.Partitions[slot] = &mbr.Partition{Index: index, Type: mbr.Fat16bLBA, Start: uint32(start), Size: uint32(count)}
	case *gpt.Table:
		// The image's backup GPT is at the image's end; the disk's is at
		// the disk's, and the space between becomes usable.
		t.Resize(uint64(disk.Size()))
		var end uint64
		used := map[int]bool{}
		for _, p := range t.Partitions {
			if p.Type == gpt.Unused {
				continue
			}
			used[p.Index] = true
			end = max(end, p.End+1)
		}
		if start, count, err = seedPlace(end, t.LastDataSector()+1); err != nil {
			return "", err
		}
		for index = 1; used[index]; index++ {
		}
		t.Partitions = append(t.Partitions, &gpt.Partition{
			Index: index, Start: start, End: start + count - 1, Type: gpt.MicrosoftBasicData, Name: protocol.SeedLabel,
		})
	default:
		return "", fmt.Errorf("partition table %q is not supported (MBR or GPT)", table.Type())
	}
	if err := dd.Partition(table); err != nil {
		return "", fmt.Errorf("write the partition table: %w", err)
	}
	fs, err := dd.CreateFilesystem(dfsdisk.FilesystemSpec{Partition: index, FSType: filesystem.TypeFat16, VolumeLabel: protocol.SeedLabel})
	if err != nil {
		return "", fmt.Errorf("create the seed filesystem: %w", err)
	}
	for _, f := range files {
		if dir := path.Dir(f.name); dir != "." {
			if err := fs.Mkdir("/" + dir); err != nil {
				return "", fmt.Errorf("seed: mkdir %s: %w", dir, err)
			}
		}
		fh, err := fs.OpenFile("/"+f.name, os.O_CREATE|os.O_RDWR|os.O_TRUNC)
		if err != nil {
			return "", fmt.Errorf("seed: %s: %w", f.name, err)
		}
		_, werr := fh.Write(f.content)
		cerr := fh.Close()
		if err := errors.Join(werr, cerr); err != nil {
			return "", fmt.Errorf("seed: %s: %w", f.name, err)
		}
	}
	return fmt.Sprintf("%s partition %d (FAT16 %s, %d MiB at %d MiB)",
		table.Type(), index, protocol.SeedLabel, count*sector>>20, start*sector>>20), nil
}

// seedPlace puts the seed partition at the end of the free space between
// sector used (the first after the last partition) and limit (the first
// past the usable space), aligned.
func seedPlace(used, limit uint64) (start, count uint64, err error) {
	const sector = 512
	align, n := uint64(partAlign/sector), uint64(seedSize/sector)
	first := (used + align - 1) / align * align
	if limit < n || (limit-n)/align*align < first {
		return 0, 0, fmt.Errorf("no free space for the %d MiB seed partition after the image's last partition (it ends at %d MiB, the disk at %d MiB)",
			seedSize>>20, used*sector>>20, limit*sector>>20)
	}
	return (limit - n) / align * align, n, nil
}

// execStep is the exec step: args["argv"] (a JSON list) run without a
// shell, for args["timeoutSeconds"], its output (the last execOutputMax
// bytes) in the result.
func execStep(ctx context.Context, args map[string]string) (string, error) {
	var argv []string
	if err := json.Unmarshal([]byte(args["argv"]), &argv); err != nil || len(argv) == 0 || argv[0] == "" {
		return "", fmt.Errorf("exec: argv %q is not a non-empty JSON list of strings", args["argv"])
	}
	timeout := defaultExecTimeout
	if s := args["timeoutSeconds"]; s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return "", fmt.Errorf("exec: timeoutSeconds %q is not a positive integer", s)
		}
		timeout = time.Duration(n) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := &tailBuffer{max: execOutputMax}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	msg := strings.TrimSpace(out.String())
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "", fmt.Errorf("exec %s: timed out after %s: %s", argv[0], timeout, msg)
	case err != nil:
		return "", fmt.Errorf("exec %s: %w: %s", argv[0], err, msg)
	}
	return msg, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max       int
	b         bytes.Buffer
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		t.b.Next(over)
		t.truncated = true
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	if t.truncated {
		return "…" + t.b.String()
	}
	return t.b.String()
}
