package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestDecodeFramesRoundTrip(t *testing.T) {
	code := 3
	for _, tc := range []struct {
		frame  any
		decode func([]byte) (any, error)
	}{
		{Hello{Type: FrameHello, AgentVersion: "bcd/test", LastExecutedSeq: 4, Clock: 9}, DecodeAgentFrame},
		{Heartbeat{Type: FrameHeartbeat, Clock: 1}, DecodeAgentFrame},
		{Inventory{Type: FrameInventory, Document: json.RawMessage(`{"kind":"NodeInventory"}`)}, DecodeAgentFrame},
		{Result{Type: FrameResult, Seq: 2, State: CommandFailed, ExitCode: &code, Stderr: "x"}, DecodeAgentFrame},
		{Observed{Type: FrameObserved, Generation: 5}, DecodeAgentFrame},
		{Welcome{Type: FrameWelcome, NodeID: "node_1", Epoch: 2, HeartbeatSeconds: 10, LeaseSeconds: 40}, DecodeServerFrame},
		{Command{Type: FrameCommand, Seq: 7, ID: "cmd_1", Kind: CommandReboot, Args: json.RawMessage(`{}`)}, DecodeServerFrame},
		{Cancel{Type: FrameCancel, Seq: 7}, DecodeServerFrame},
		{Spec{Type: FrameSpec, Generation: 3}, DecodeServerFrame},
		{Header{Type: "future"}, DecodeAgentFrame},
		{Header{Type: "future"}, DecodeServerFrame},
	} {
		line, err := json.Marshal(tc.frame)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tc.decode(line)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if !reflect.DeepEqual(got, tc.frame) {
			t.Errorf("%s decoded as %#v", line, got)
		}
	}
	if _, err := DecodeAgentFrame([]byte(`{"type":"result","seq":"x"}`)); err == nil {
		t.Error("a result with a string seq decoded")
	}
	if _, err := DecodeServerFrame([]byte(`not json`)); err == nil {
		t.Error("a line that is not JSON decoded")
	}
}
