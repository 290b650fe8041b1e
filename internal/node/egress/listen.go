package egress

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/zyvor/kairon/internal/node/network"
)

// Listen opens the DNS proxy's UDP and TCP sockets on addr in network
// namespace netns (empty: the caller's): the guests' redirected queries
// arrive in the bridge's namespace. A socket stays in the namespace it was
// made in, whichever thread uses it later.
func Listen(netns, addr string) (*net.UDPConn, net.Listener, error) {
	var uc net.PacketConn
	var ln net.Listener
	listen := func() (err error) {
		if uc, err = net.ListenPacket("udp", addr); err != nil {
			return err
		}
		if ln, err = net.Listen("tcp", addr); err != nil {
			_ = uc.Close()
		}
		return err
	}
	var err error
	if netns == "" {
		err = listen()
	} else {
		err = inNetNS(netns, listen)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("egress: DNS proxy on %s (netns %q): %w", addr, netns, err)
	}
	return uc.(*net.UDPConn), ln, nil
}

// inNetNS runs fn on a thread in the named namespace (network.InNamespace).
var inNetNS = network.InNamespace

// ListenTCP opens a TCP listener on addr in network namespace netns
// (empty: the caller's), for the SNI proxy.
func ListenTCP(netns, addr string) (net.Listener, error) {
	var ln net.Listener
	listen := func() (err error) { ln, err = net.Listen("tcp", addr); return err }
	var err error
	if netns == "" {
		err = listen()
	} else {
		err = inNetNS(netns, listen)
	}
	if err != nil {
		return nil, fmt.Errorf("egress: SNI proxy on %s (netns %q): %w", addr, netns, err)
	}
	return ln, nil
}

// DialIn dials from network namespace netns (empty: the caller's): the
// proxies reach what the guests would have from the bridge's namespace.
func DialIn(netns string) func(ctx context.Context, network, address string) (net.Conn, error) {
	d := &net.Dialer{}
	if netns == "" {
		return d.DialContext
	}
	return func(ctx context.Context, network, address string) (c net.Conn, err error) {
		err = inNetNS(netns, func() error { c, err = d.DialContext(ctx, network, address); return err })
		return c, err
	}
}

// EnableForwarding turns on IPv4 forwarding in netns (empty: the
// caller's), which guests' traffic to the uplink needs.
func EnableForwarding(netns string) error {
	write := func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644) }
	var err error
	if netns == "" {
		err = write()
	} else {
		err = inNetNS(netns, write)
	}
	if err != nil {
		return fmt.Errorf("egress: enabling IPv4 forwarding (netns %q): %w", netns, err)
	}
	return nil
}
