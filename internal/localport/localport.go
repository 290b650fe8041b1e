package localport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

// rangeFile holds the kernel's ephemeral port range ("32768\t60999").
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowest is the bottom of the ports picked from: above the well-known and
// most registered ones people run services on.
const lowest = 10000

// Free returns a TCP port free on 127.0.0.1 at the time of the call, below
// the ephemeral range where the kernel lets that happen, and not in avoid.
func Free(avoid []int) (int, error) {
	if top, ok := ephemeralStart(); ok && top > lowest+100 {
		for range 50 {
			port := lowest + rand.IntN(top-lowest)
			if slices.Contains(avoid, port) {
				continue
			}
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	// No room below the range (or no /proc): any port the kernel gives.
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port on 127.0.0.1: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !slices.Contains(avoid, port) {
			return port, nil
		}
	}
	return 0, errors.New("finding a free port on 127.0.0.1: no distinct port after 20 tries")
}

// FreeAddress is Free as a 127.0.0.1:PORT address.
func FreeAddress() (string, error) {
	port, err := Free(nil)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// ephemeralStart is the first port of the kernel's ephemeral range.
func ephemeralStart() (int, bool) {
	data, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return 0, false
	}
	low, err := strconv.Atoi(fields[0])
	return low, err == nil
}
