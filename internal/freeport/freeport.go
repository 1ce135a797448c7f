// Package freeport picks TCP ports for servers that must be told a port
// number before they listen (PostgreSQL, Temporal's internal services).
//
// Asking the kernel for port 0 returns a port from the ephemeral range, the
// same range outgoing connections draw their source ports from; on a busy
// machine such a port is often taken again before the server binds it. Ports
// here are drawn at random from below that range instead, and each is
// checked by listening on it once.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Lowest is the first port handed out: below it lie well-known and commonly
// configured service ports, the dev stack's defaults among them, which a
// port picked for a test's server must not take.
const Lowest = 20000

// Pick returns a port that could be listened on at host a moment ago.
func Pick(host string) (int, error) {
	ports, err := PickN(host, 1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// PickN returns n distinct ports that could be listened on at host a moment
// ago.
func PickN(host string, n int) ([]int, error) {
	high := ephemeralLow() - 1
	ports := make([]int, 0, n)
	seen := make(map[int]bool, n)
	for tries := 0; len(ports) < n; tries++ {
		var port int
		if high > Lowest && tries < 100*n {
			port = Lowest + rand.IntN(high-Lowest+1)
		}
		got, err := probe(host, port)
		if err != nil {
			if port == 0 {
				return nil, fmt.Errorf("find a free port on %s: %w", host, err)
			}
			continue
		}
		if !seen[got] {
			seen[got] = true
			ports = append(ports, got)
		}
	}
	return ports, nil
}

// probe listens on host:port once and returns the port bound.
func probe(host string, port int) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the start of the kernel's ephemeral port range, 32768
// where it cannot be read (Linux's default; BSDs and macOS use 49152).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil {
				return low
			}
		}
	}
	return 32768
}
