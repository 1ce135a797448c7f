// Package sshtrust keeps a node's sshd trust equal to its NodeSpec's SSH
// section: the user CAs whose certificates sshd accepts
// (TrustedUserCAKeys), the revoked certificates (RevokedKeys, a KRL built
// with ssh-keygen -k), and per Unix user the principals that log in as it
// (AuthorizedPrincipalsFile). The files live in one directory (DefaultDir)
// with an sshd_config snippet pointing at them, which the operator's sshd
// includes. bcd never restarts sshd: sshd reads each of these files anew
// for every authentication.
//
// Every file is replaced atomically (a temporary file in the directory,
// synced, then renamed), and in the order that never widens access
// mid-update: the revocation list first, then the CA keys, then the
// principals. When the spec cannot be written faithfully (a malformed
// line, no ssh-keygen to build the KRL), the CA file is emptied: sshd then
// accepts no certificate at all until a spec is written, never a revoked
// one.
package sshtrust

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/agent/nodespec"
)

// DefaultDir is where the files live on a node.
const DefaultDir = "/etc/ssh/better-compute"

// The files in the directory.
const (
	CAKeysFile    = "trusted_user_ca_keys"
	RevokedFile   = "revoked_keys"
	PrincipalsDir = "principals"
	SnippetFile   = "sshd_config.conf"
)

// userPattern is a Unix user name (the control plane's grammar too); it
// never holds a "/", so a user's file stays in the principals directory.
var userPattern = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// Writer writes the files of one directory.
type Writer struct {
	// Dir is the directory (DefaultDir on a node).
	Dir string
	// Keygen is ssh-keygen's path; "" looks it up in PATH.
	Keygen string
}

// Snippet is the sshd_config drop-in that points sshd at dir's files.
func Snippet(dir string) string {
	return "# Written by bcd (agent/sshtrust): the node's SSH user certificate trust.\n" +
		"# Include this file from sshd_config (before any other setting of these keywords);\n" +
		"# sshd reads the files below for every login, so it needs no restart when they change.\n" +
		"TrustedUserCAKeys " + filepath.Join(dir, CAKeysFile) + "\n" +
		"RevokedKeys " + filepath.Join(dir, RevokedFile) + "\n" +
		"AuthorizedPrincipalsFile " + filepath.Join(dir, PrincipalsDir) + "/%u\n"
}

// SnippetPath is where the snippet is written.
func (w *Writer) SnippetPath() string { return filepath.Join(w.Dir, SnippetFile) }

// Ensure makes the directory and the snippet and, where they are missing,
// an empty CA file and an empty revocation list: an sshd that includes the
// snippet before bcd's first spec starts, accepts no certificate, and
// still accepts the keys it accepted before (sshd refuses every public key
// when its RevokedKeys file is unreadable).
func (w *Writer) Ensure() error {
	if err := os.MkdirAll(filepath.Join(w.Dir, PrincipalsDir), 0o755); err != nil {
		return fmt.Errorf("sshtrust: %w", err)
	}
	if err := writeAtomic(w.SnippetPath(), []byte(Snippet(w.Dir))); err != nil {
		return err
	}
	for _, name := range []string{RevokedFile, CAKeysFile} {
		path := filepath.Join(w.Dir, name)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if err := writeAtomic(path, nil); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("sshtrust: %w", err)
		}
	}
	return nil
}

// Write makes the directory's files say spec. On an error sshd is left
// accepting no certificate (the CA file emptied) and the error says why.
func (w *Writer) Write(ctx context.Context, spec nodespec.SSH) error {
	if err := w.Ensure(); err != nil {
		return err
	}
	if err := w.write(ctx, spec); err != nil {
		if closeErr := writeAtomic(filepath.Join(w.Dir, CAKeysFile), nil); closeErr != nil {
			return errors.Join(err, closeErr)
		}
		return err
	}
	return nil
}

func (w *Writer) write(ctx context.Context, spec nodespec.SSH) error {
	cas, err := caKeys(spec.TrustedUserCAKeys)
	if err != nil {
		return err
	}
	revoked, err := revokedLines(spec.RevokedKeys)
	if err != nil {
		return err
	}
	principals, err := principalFiles(spec.AuthorizedPrincipals)
	if err != nil {
		return err
	}
	krl, err := w.krl(ctx, revoked)
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(w.Dir, RevokedFile), krl); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(w.Dir, CAKeysFile), lines(cas)); err != nil {
		return err
	}
	return w.writePrincipals(principals)
}

// krl builds the revocation list of revoked (certificate and key lines)
// with ssh-keygen -k: a certificate line revokes that certificate alone,
// by its CA and serial. No revocation is an empty file, which sshd reads
// as a list of no keys.
func (w *Writer) krl(ctx context.Context, revoked []string) ([]byte, error) {
	if len(revoked) == 0 {
		return nil, nil
	}
	keygen := w.Keygen
	if keygen == "" {
		var err error
		if keygen, err = exec.LookPath("ssh-keygen"); err != nil {
			return nil, fmt.Errorf("sshtrust: building the revocation list needs ssh-keygen (openssh-client): %w", err)
		}
	}
	tmp, err := os.MkdirTemp(w.Dir, ".krl-")
	if err != nil {
		return nil, fmt.Errorf("sshtrust: %w", err)
	}
	defer os.RemoveAll(tmp)
	spec, out := filepath.Join(tmp, "revoked.txt"), filepath.Join(tmp, "revoked.krl")
	if err := os.WriteFile(spec, lines(revoked), 0o600); err != nil {
		return nil, fmt.Errorf("sshtrust: %w", err)
	}
	cmd := exec.CommandContext(ctx, keygen, "-q", "-k", "-f", out, spec)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("sshtrust: ssh-keygen -k: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("sshtrust: %w", err)
	}
	return b, nil
}

// writePrincipals writes each user's file and removes the files of users
// no longer listed.
func (w *Writer) writePrincipals(files map[string][]byte) error {
	dir := filepath.Join(w.Dir, PrincipalsDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("sshtrust: %w", err)
	}
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("sshtrust: %w", err)
			}
		}
	}
	users := make([]string, 0, len(files))
	for u := range files {
		users = append(users, u)
	}
	slices.Sort(users)
	for _, u := range users {
		if err := writeAtomic(filepath.Join(dir, u), files[u]); err != nil {
			return err
		}
	}
	return nil
}

// caKeys checks each CA line is a public key (not a certificate) and
// answers it in authorized_keys format.
func caKeys(in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for i, line := range in {
		pub, comment, err := oneKey(line)
		if err != nil {
			return nil, fmt.Errorf("sshtrust: trustedUserCaKeys[%d]: %w", i, err)
		}
		if _, ok := pub.(*ssh.Certificate); ok {
			return nil, fmt.Errorf("sshtrust: trustedUserCaKeys[%d] is a certificate, not a CA key", i)
		}
		out = append(out, keyLine(pub, comment))
	}
	return out, nil
}

// revokedLines checks each revoked line is a key or certificate.
func revokedLines(in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for i, line := range in {
		pub, comment, err := oneKey(line)
		if err != nil {
			return nil, fmt.Errorf("sshtrust: revokedKeys[%d]: %w", i, err)
		}
		out = append(out, keyLine(pub, comment))
	}
	return out, nil
}

// principalFiles checks the users and principals and answers each user's
// file: one principal a line.
func principalFiles(in map[string][]string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(in))
	for user, principals := range in {
		if !userPattern.MatchString(user) {
			return nil, fmt.Errorf("sshtrust: authorizedPrincipals: %q is not a Unix user name", user)
		}
		for _, p := range principals {
			if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f || r == ',' }) {
				return nil, fmt.Errorf("sshtrust: authorizedPrincipals[%s]: %q is not a principal", user, p)
			}
		}
		out[user] = lines(principals)
	}
	return out, nil
}

// oneKey parses one authorized_keys line without options.
func oneKey(line string) (ssh.PublicKey, string, error) {
	if strings.ContainsAny(line, "\r\n") {
		return nil, "", errors.New("more than one line")
	}
	pub, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, "", err
	}
	if len(options) > 0 || len(bytes.TrimSpace(rest)) > 0 {
		return nil, "", errors.New("not a single key without options")
	}
	return pub, comment, nil
}

func keyLine(pub ssh.PublicKey, comment string) string {
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	if comment = strings.TrimSpace(comment); comment != "" {
		line += " " + comment
	}
	return line
}

func lines(ls []string) []byte {
	if len(ls) == 0 {
		return nil
	}
	return []byte(strings.Join(ls, "\n") + "\n")
}

// writeAtomic replaces path with b (mode 0644: sshd reads it as root, the
// files hold public keys only).
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sshtrust-*")
	if err != nil {
		return fmt.Errorf("sshtrust: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("sshtrust: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sshtrust: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("sshtrust: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("sshtrust: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("sshtrust: %w", err)
	}
	return nil
}
