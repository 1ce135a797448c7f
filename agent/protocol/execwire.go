package protocol

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Exec tunnels (Tunnel.Target TunnelExec): the stream's bytes are frames
// of a 1-byte channel, a 4-byte big-endian payload length and the payload
// (at most MaxExecFrame). The caller sends ExecStdin and, once, an empty
// ExecStdinClosed; the agent sends ExecStdout, ExecStderr and, last, one
// ExecExit whose payload is an ExecExitStatus in JSON.

// ExecChannel is an exec frame's channel.
type ExecChannel byte

// Exec channels.
const (
	ExecStdin       ExecChannel = 0 // caller → agent
	ExecStdinClosed ExecChannel = 1 // caller → agent, empty
	ExecStdout      ExecChannel = 2 // agent → caller
	ExecStderr      ExecChannel = 3 // agent → caller
	ExecExit        ExecChannel = 4 // agent → caller, ExecExitStatus, the last frame
)

// Limits of exec tunnels.
const (
	// MaxExecFrame bounds one frame's payload; longer writes are split.
	MaxExecFrame = 64 << 10
	// DefaultExecOutputLimit is the stdout and stderr bytes (together) an
	// exec tunnel forwards when Tunnel.ExecOutputLimit is 0.
	DefaultExecOutputLimit = 16 << 20
	// execHeader is a frame's channel and length.
	execHeader = 5
)

// ExecExitStatus is the ExecExit frame's payload.
type ExecExitStatus struct {
	ExitCode int  `json:"exitCode"`
	TimedOut bool `json:"timedOut"`
	// Error says why the command could not run or was stopped ("" when it
	// ran to its exit).
	Error string `json:"error,omitempty"`
	// Truncated says output past the limit was dropped.
	Truncated bool `json:"truncated"`
}

// ErrExecFrame is a malformed exec frame.
var ErrExecFrame = errors.New("protocol: malformed exec frame")

func (c ExecChannel) valid() bool { return c <= ExecExit }

// ExecEncoder writes exec frames to a stream; it is safe for concurrent
// use (stdout and stderr are written from their own goroutines).
type ExecEncoder struct {
	mu sync.Mutex
	w  io.Writer
}

// NewExecEncoder writes frames to w.
func NewExecEncoder(w io.Writer) *ExecEncoder { return &ExecEncoder{w: w} }

// Write sends p on channel ch, in frames of at most MaxExecFrame; an empty
// p sends one empty frame.
func (e *ExecEncoder) Write(ch ExecChannel, p []byte) error {
	if !ch.valid() {
		return fmt.Errorf("%w: channel %d", ErrExecFrame, ch)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), MaxExecFrame)
		// One Write per frame: a frame is never interleaved with another.
		buf := make([]byte, execHeader+n)
		buf[0] = byte(ch)
		binary.BigEndian.PutUint32(buf[1:execHeader], uint32(n))
		copy(buf[execHeader:], p[:n])
		if _, err := e.w.Write(buf); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// Exit sends the ExecExit frame.
func (e *ExecEncoder) Exit(s ExecExitStatus) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return e.Write(ExecExit, b)
}

// Channel is an io.Writer of channel ch.
func (e *ExecEncoder) Channel(ch ExecChannel) io.Writer { return channelWriter{e, ch} }

type channelWriter struct {
	e  *ExecEncoder
	ch ExecChannel
}

func (w channelWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := w.e.Write(w.ch, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// ExecDecoder reads exec frames from a stream.
type ExecDecoder struct {
	r   io.Reader
	buf []byte
}

// NewExecDecoder reads frames from r.
func NewExecDecoder(r io.Reader) *ExecDecoder { return &ExecDecoder{r: r} }

// Next reads one frame. The payload is valid until the next call. The
// stream's end between frames is io.EOF, inside one io.ErrUnexpectedEOF;
// an unknown channel or an oversized length is ErrExecFrame.
func (d *ExecDecoder) Next() (ExecChannel, []byte, error) {
	var h [execHeader]byte
	if _, err := io.ReadFull(d.r, h[:]); err != nil {
		return 0, nil, err
	}
	ch, n := ExecChannel(h[0]), binary.BigEndian.Uint32(h[1:])
	if !ch.valid() {
		return 0, nil, fmt.Errorf("%w: channel %d", ErrExecFrame, ch)
	}
	if n > MaxExecFrame {
		return 0, nil, fmt.Errorf("%w: %d bytes, at most %d", ErrExecFrame, n, MaxExecFrame)
	}
	if cap(d.buf) < int(n) {
		d.buf = make([]byte, n)
	}
	p := d.buf[:n]
	if _, err := io.ReadFull(d.r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return ch, p, nil
}

// DecodeExit reads an ExecExit frame's payload.
func DecodeExit(p []byte) (ExecExitStatus, error) {
	var s ExecExitStatus
	if err := json.Unmarshal(p, &s); err != nil {
		return s, fmt.Errorf("%w: exit status: %v", ErrExecFrame, err)
	}
	return s, nil
}
