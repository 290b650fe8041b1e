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

// Where AutoUpstream looks: the node's resolv.conf, and the one
// systemd-resolved writes with the servers it forwards to.
var (
	hostResolvConf     = "/etc/resolv.conf"
	resolvedResolvConf = "/run/systemd/resolve/resolv.conf"
)

// AutoUpstream is the node's resolver for --egress-dns-upstream=auto: the
// first nameserver of /etc/resolv.conf. When that is a loopback address (a
// local stub such as systemd-resolved's 127.0.0.53), it is the first one of
// systemd-resolved's own list instead, as the kubelet picks for Pods: the
// DNS proxy forwards from the guests' network namespace and guests are
// told to ask it (docs/guides/networking.md), and neither reaches the
// node's loopback.
func AutoUpstream() (string, error) {
	up, err := ResolvConfUpstream(hostResolvConf)
	if err != nil {
		return "", err
	}
	if host, _, _ := net.SplitHostPort(up); !isLoopback(host) {
		return up, nil
	}
	if resolved, err := ResolvConfUpstream(resolvedResolvConf); err == nil {
		if host, _, _ := net.SplitHostPort(resolved); !isLoopback(host) {
			return resolved, nil
		}
	}
	return up, nil
}

func isLoopback(host string) bool {
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
}
