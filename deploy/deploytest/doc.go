// Package deploytest checks the production deployment pieces under deploy/
// (the systemd units, the Helm chart, the compose file and the Dockerfile)
// against the real command lines of better-compute and bcd: every
// subcommand, flag and environment variable they name must exist.
package deploytest
