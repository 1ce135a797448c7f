//go:build !unix

package commands

import "os/exec"

// ownProcessGroup: without process groups, cancellation kills the process
// alone (exec.CommandContext's default).
func ownProcessGroup(*exec.Cmd) {}
