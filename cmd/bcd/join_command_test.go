package main

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api/nodes"
)

// The command line joinTokens.create answers is one `bcd node join`
// accepts, with the URL, token and state directory it names.
func TestJoinTokensCommandLineParses(t *testing.T) {
	const url, token = "https://compute.example.com:8443/", "bcjt_abc234"
	line := nodes.JoinCommand(url, token)
	words := shellWords(t, line)
	if len(words) < 3 || words[0] != "bcd" || words[1] != "node" || words[2] != "join" {
		t.Fatalf("command line %q is not bcd node join", line)
	}
	cmd := nodeJoinCommand()
	if err := cmd.ParseFlags(words[3:]); err != nil {
		t.Fatalf("bcd node join refuses %q: %v", line, err)
	}
	for flag, want := range map[string]string{"api": url, "token": token, "state-dir": nodes.JoinStateDir} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q (from %q)", flag, got, want, line)
		}
	}
	if placeholder := nodes.JoinCommand("", token); !strings.Contains(placeholder, `--api "$BC_API_URL"`) {
		t.Errorf("without a public URL: %q", placeholder)
	}
	if quoted := shellWords(t, nodes.JoinCommand("https://x.example/it's here", token)); quoted[4] != "https://x.example/it's here" {
		t.Errorf("a URL with a quote and a space reads back as %q", quoted[4])
	}
}

// shellWords splits a command line of bare and single-quoted words as a
// POSIX shell does (a backslash outside quotes takes the next character
// as it is, which is how a quoted word holds a quote).
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted, escaped := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			w.WriteRune(r)
			escaped = false
		case quoted && r == '\'':
			quoted = false
		case quoted:
			w.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == '\\':
			escaped, inWord = true, true
		case r == ' ':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unterminated quote in %q", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}
