package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// ResolvConfUpstream is the first nameserver of a resolv.conf file, as
// host:53: the node's own resolver, which the DNS proxy forwards to by
// default.
func ResolvConfUpstream(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		// A scoped IPv6 address (fe80::1%eth0) is kept as written.
		host, _, _ := strings.Cut(fields[1], "%")
		if _, err := netip.ParseAddr(host); err != nil {
			continue
		}
		return net.JoinHostPort(fields[1], "53"), nil
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s names no nameserver", path)
}
