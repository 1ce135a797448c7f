package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func TestExecFramesRoundTrip(t *testing.T) {
	type frame struct {
		ch ExecChannel
		p  []byte
	}
	big := bytes.Repeat([]byte{7}, MaxExecFrame*2+3)
	for _, tc := range []struct {
		name string
		in   []frame
		want []frame // as decoded: long payloads split
	}{
		{name: "stdin then closed", in: []frame{{ExecStdin, []byte("hi")}, {ExecStdinClosed, nil}},
			want: []frame{{ExecStdin, []byte("hi")}, {ExecStdinClosed, []byte{}}}},
		{name: "stdout, stderr, exit", in: []frame{{ExecStdout, []byte("out")}, {ExecStderr, []byte("err")}, {ExecExit, []byte(`{"exitCode":3}`)}},
			want: []frame{{ExecStdout, []byte("out")}, {ExecStderr, []byte("err")}, {ExecExit, []byte(`{"exitCode":3}`)}}},
		{name: "a long write is split", in: []frame{{ExecStdout, big}},
			want: []frame{{ExecStdout, big[:MaxExecFrame]}, {ExecStdout, big[MaxExecFrame : 2*MaxExecFrame]}, {ExecStdout, big[2*MaxExecFrame:]}}},
		{name: "exactly one frame's worth", in: []frame{{ExecStderr, big[:MaxExecFrame]}},
			want: []frame{{ExecStderr, big[:MaxExecFrame]}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			enc := NewExecEncoder(&buf)
			for _, f := range tc.in {
				if err := enc.Write(f.ch, f.p); err != nil {
					t.Fatal(err)
				}
			}
			dec := NewExecDecoder(&buf)
			for i, w := range tc.want {
				ch, p, err := dec.Next()
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if ch != w.ch || !bytes.Equal(p, w.p) {
					t.Fatalf("frame %d: channel %d, %d bytes; want %d, %d bytes", i, ch, len(p), w.ch, len(w.p))
				}
			}
			if _, _, err := dec.Next(); !errors.Is(err, io.EOF) {
				t.Fatalf("after the frames: %v, want EOF", err)
			}
		})
	}
}

func TestExecExitRoundTrip(t *testing.T) {
	for _, s := range []ExecExitStatus{{}, {ExitCode: 137, TimedOut: true, Error: "killed", Truncated: true}} {
		var buf bytes.Buffer
		if err := NewExecEncoder(&buf).Exit(s); err != nil {
			t.Fatal(err)
		}
		ch, p, err := NewExecDecoder(&buf).Next()
		if err != nil || ch != ExecExit {
			t.Fatalf("channel %d, %v", ch, err)
		}
		got, err := DecodeExit(p)
		if err != nil || got != s {
			t.Fatalf("%+v, %v; want %+v", got, err, s)
		}
	}
}

func TestExecDecoderRefusesMalformedFrames(t *testing.T) {
	header := func(ch byte, n uint32) []byte {
		b := []byte{ch, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], n)
		return b
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{name: "unknown channel", raw: header(9, 0), want: ErrExecFrame},
		{name: "oversized", raw: header(2, MaxExecFrame+1), want: ErrExecFrame},
		{name: "cut header", raw: []byte{2, 0}, want: io.ErrUnexpectedEOF},
		{name: "cut payload", raw: append(header(2, 4), 'a'), want: io.ErrUnexpectedEOF},
		{name: "exit not JSON", raw: append(header(4, 1), '{'), want: ErrExecFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, p, err := NewExecDecoder(bytes.NewReader(tc.raw)).Next()
			if err == nil && ch == ExecExit {
				_, err = DecodeExit(p)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
	if err := NewExecEncoder(io.Discard).Write(ExecChannel(5), nil); !errors.Is(err, ErrExecFrame) {
		t.Fatalf("encoding channel 5: %v", err)
	}
}
