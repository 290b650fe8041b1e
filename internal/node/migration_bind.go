package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Where the migration listener binds (issue 10, finding 2). A
// --migration-listen without a host (":10251", "0.0.0.0:10251") does not
// mean every address: it means the node's InternalIP, the address the
// controller advertises (migration-endpoint) and other nodes dial. Every
// address would include the guests' gateway on the node's bridge, where any
// guest could reach the port. An explicit host is taken as given, except
// the gateway or another address of the guests' network, which is refused.

// listenMigration opens the migration listener on opts.MigrationListenAddress,
// an unspecified host replaced by the node's InternalIP (migrationBindIP).
func (a *Agent) listenMigration(cfg *rest.Config) (net.Listener, error) {
	listen := a.opts.MigrationListenAddress
	if err := CheckMigrationTransport(listen, a.opts.MigrationTLSDir, a.opts.MigrationInsecure); err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--migration-listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		bind, err := a.migrationBindIP(cfg)
		if err != nil {
			return nil, fmt.Errorf("--migration-listen %s: %w", listen, err)
		}
		host = bind.String()
	}
	if ip := net.ParseIP(host); ip != nil && a.opts.Network != nil && a.opts.Network.CIDR.IsValid() {
		if addr, ok := netip.AddrFromSlice(ip); ok && a.opts.Network.CIDR.Contains(addr.Unmap()) {
			return nil, fmt.Errorf("--migration-listen %s: %s is in the guests' network %s (--network-cidr): guests could reach the migration port",
				listen, host, a.opts.Network.CIDR)
		}
	}
	address := net.JoinHostPort(host, port)
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("--migration-listen %s (bound to %s): %w", listen, address, err)
	}
	return ln, nil
}

// migrationBindIP is the node's InternalIP: --node-ip if given; for a
// registered node the address the agent itself writes as InternalIP
// (endpoint); else the first InternalIP in the Node's status.
func (a *Agent) migrationBindIP(cfg *rest.Config) (net.IP, error) {
	if a.opts.NodeIP != "" {
		ip := net.ParseIP(a.opts.NodeIP)
		if ip == nil || ip.IsUnspecified() {
			return nil, fmt.Errorf("--node-ip %q is not an IP address", a.opts.NodeIP)
		}
		return ip, nil
	}
	if a.opts.Register {
		host, _ := a.endpoint()
		return net.ParseIP(host), nil
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: a.opts.NodeName}, node); err != nil {
		return nil, fmt.Errorf("reading node %s for its InternalIP (or give --node-ip): %w", a.opts.NodeName, err)
	}
	for _, addr := range node.Status.Addresses {
		if addr.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(addr.Address); ip != nil && !ip.IsUnspecified() {
				return ip, nil
			}
		}
	}
	return nil, fmt.Errorf("node %s has no InternalIP to bind to: give --node-ip or a host in --migration-listen", a.opts.NodeName)
}
