package node

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/rules"
)

// Options configure one agent.
type Options struct {
	// NodeName is the Node this agent serves.
	NodeName string
	// Register makes the agent create and own its Node object, as in
	// kairon-local. Otherwise the Node exists (a kubelet's) and the agent only
	// labels it.
	Register bool
	// Backend runs the VMs.
	Backend backend.Backend
	// Images pulls and caches the OCI images of Machines whose spec.image
	// is a reference (machine_image.go); nil: such Machines fail with a
	// message saying the node cannot run them.
	Images ImageStore
	// PullCredentialsURL, when set, is where the agent asks
	// kairon-controller for its Machines' pull secrets (https://...
	// /pull-credentials; pull_credentials.go), with the bearer token of its
	// API server credentials, instead of reading the Secrets itself: for
	// agents that share one ServiceAccount, which RBAC cannot tell apart.
	// PullCredentialsCAFile is the PEM CA the controller's certificate is
	// checked against ("": the system's).
	PullCredentialsURL    string
	PullCredentialsCAFile string
	// ImageGCInterval is how often unused images are collected (0: a
	// minute).
	ImageGCInterval time.Duration
	// GuestDir holds guest images: <image>/vmlinux and <image>/initramfs.cpio.gz.
	GuestDir string
	// StateDir keeps what must survive a restart (addresses, TLS key).
	StateDir string
	// CPU and Memory are the capacity advertised on a registered Node.
	CPU    int64
	Memory resource.Quantity
	// Network attaches Machines to a bridge; nil runs them without a NIC.
	Network *NetworkOptions
	// Egress tunes MachineNetworkPolicy enforcement (nil: defaults).
	Egress *EgressOptions
	// MetricsAddress serves Prometheus metrics (the egress ones)
	// on host:port (empty: off).
	MetricsAddress string
	// ListenAddress serves consoles to the API server's node proxy (host:port).
	ListenAddress string
	// MigrationListenAddress accepts live migrations from other agents
	// (host:port; empty: this agent cannot receive live migrations).
	MigrationListenAddress string
	// MigrationTLSDir holds tls.crt, tls.key and ca.crt for mutual TLS
	// between agents during live migrations; tls.crt must name this node
	// (Subject CN or DNS SAN), as the peers check. Empty: plain TCP, which
	// needs MigrationInsecure unless the listener is on loopback.
	MigrationTLSDir string
	// NodeIP is the node's InternalIP (--node-ip): where the migration
	// listener binds when MigrationListenAddress has no host. Empty: the
	// Node's status (or, registering, the console listener's host).
	NodeIP string
	// MigrationInsecure allows live migrations in plain TCP, unauthenticated,
	// on any address (--migration-insecure): for tests only.
	MigrationInsecure bool
	// MigrationHandshakeTimeout bounds a live migration connection's TLS
	// handshake and request line (0: 10s); MigrationMaxHandshakes is how many
	// connections may be at that stage at once (0: 8), more are closed.
	MigrationHandshakeTimeout time.Duration
	MigrationMaxHandshakes    int
	// ClientCAFile, when set, makes the console server accept only clients
	// with a certificate signed by this CA (the API server's kubelet client
	// certificate, or an admin's).
	ClientCAFile string
	// HealthProbeAddress serves /healthz and /readyz (health.go) for the
	// DaemonSet's probes (host:port; empty: off).
	HealthProbeAddress string
	// Interval is the reconcile tick; HeartbeatInterval refreshes the Node's Ready condition.
	Interval          time.Duration
	HeartbeatInterval time.Duration
	// LeaseRenewInterval is how often the agent renews its Lease
	// (lease.go); zero means rules.DefaultLeaseRenewInterval. It must be
	// well under kairon-controller's -node-grace-period.
	LeaseRenewInterval time.Duration
	// BootTimeout fails a Machine whose VM has not reached Running this
	// long after the agent first tried to start it, transient start errors
	// and their retries included (boot.go); zero means DefaultBootTimeout.
	BootTimeout time.Duration
	// InstancePollInterval is how often the backend is asked what runs, to see
	// guests become ready and VMs die.
	InstancePollInterval time.Duration
	// OnShutdown is what a graceful stop of the agent does to its VMs:
	// ShutdownKeep (the default) leaves them running for the next agent to
	// adopt; ShutdownSuspend saves and stops them, and the next agent
	// restores them (kairon-local).
	OnShutdown ShutdownAction
	// SuspendTimeout bounds how long ShutdownSuspend may take for all VMs
	// together; a VM not saved by then is left running.
	SuspendTimeout time.Duration
	// SnapshotDir is where the agent writes the MachineSnapshots it takes
	// and reads those it restores (machine_snapshot.go); empty:
	// StateDir/machinesnapshots.
	SnapshotDir string
	// SnapshotStore names the storage SnapshotDir is: agents with the same
	// name must see the same files there (a shared file system). Empty:
	// the node's own, kaironv1.NodeLocalSnapshotStore(NodeName). It is the
	// Node's label kairon.zyvor.dev/snapshot-store, so it must be a label value.
	SnapshotStore string
}

// ShutdownAction is what the agent does to its VMs when it stops gracefully.
type ShutdownAction string

const (
	// ShutdownKeep leaves the VMs running; the next agent re-adopts them.
	// For agents run by a DaemonSet, whose restarts must not touch guests.
	ShutdownKeep ShutdownAction = "keep"
	// ShutdownSuspend saves each VM's state (memory and devices) to the
	// state dir and stops it; the next agent restores it, and the guest
	// goes on where it was. For kairon-local, where nothing may outlive it.
	ShutdownSuspend ShutdownAction = "suspend"
)

// DefaultBootTimeout is Options.BootTimeout when unset.
const DefaultBootTimeout = 5 * time.Minute

// DefaultSuspendTimeout is Options.SuspendTimeout when unset.
const DefaultSuspendTimeout = 2 * time.Minute

// NetworkOptions describe the node network.
type NetworkOptions struct {
	// CIDR is the guests' network; its first address is the bridge's.
	CIDR netip.Prefix
	// Pool is the part of CIDR this node hands out (zero: all of it), for
	// nodes that share one network.
	Pool netip.Prefix
	// Bridge is the bridge's name.
	Bridge string
	// NetNS, when set, keeps the bridge and taps in that network namespace.
	NetNS string
	// NoLinks allocates addresses without creating bridge or taps (sim backend).
	NoLinks bool
	// AllowGuestMetadata lets guests reach the cloud metadata addresses
	// (network.MetadataAddresses) through the node
	// (--allow-guest-metadata); off, the baseline drops what they send
	// there.
	AllowGuestMetadata bool
	// ClusterCIDR, when set, is the cluster-wide guest range: the node
	// claims a subnet of NodePrefix bits of it (crossnode_subnet.go), which
	// replaces Pool, and CIDR becomes the whole range (every node's bridge
	// is its gateway, so a guest keeps it wherever it moves).
	ClusterCIDR netip.Prefix
	NodePrefix  int
	// CrossNode is how this node routes to other nodes' guest subnets
	// (network.CrossNodeMode; empty: none); it needs ClusterCIDR.
	// CrossNodeAddress is where the other nodes send traffic for this
	// node's guests (zero: its InternalIP); VXLANID and VXLANPort are the
	// tunnels' network id and UDP port.
	CrossNode        network.CrossNodeMode
	CrossNodeAddress netip.Addr
	VXLANID          int
	VXLANPort        int
}

// EgressOptions configure MachineNetworkPolicy enforcement
// (docs/guides/egress.md). Enforcement is on wherever the agent has a node
// network with links; these only tune it.
type EgressOptions struct {
	// DNSPort is where the DNS proxy listens in the bridge's namespace;
	// confined guests' DNS is redirected there. 0: no proxy, and a
	// confined guest's DNS is traffic like any other (allowFqdns then
	// never learns an address).
	DNSPort uint16
	// DNSUpstream is the resolver the proxy forwards allowed queries to
	// (host:port).
	DNSUpstream string
	// SNIPort is where the SNI proxy listens in the bridge's namespace;
	// confined guests' TCP that only an allowSNI grant allows is redirected
	// there. 0: no proxy, and such TCP is dropped.
	SNIPort uint16
	// Masquerade is the uplink guests' traffic leaves by with the node's
	// address; "auto": the default route's interface (none: no NAT);
	// empty: no NAT.
	Masquerade string
	// DNSMinTTL is the shortest a DNS-learned address stays allowed: an
	// answer's TTL is raised to it (0: the enforcer's 30 s).
	DNSMinTTL time.Duration
	// Enforcer replaces nftables (tests).
	Enforcer EgressEnforcer
}

func (o *Options) defaults() error {
	if o.NodeName == "" {
		return errors.New("--node-name is required")
	}
	if o.Backend == nil {
		return errors.New("no backend")
	}
	if o.StateDir == "" {
		return errors.New("--state-dir is required")
	}
	if o.CPU <= 0 && o.Register {
		return fmt.Errorf("--cpu must be at least 1, got %d", o.CPU)
	}
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = 10 * time.Second
	}
	if o.LeaseRenewInterval <= 0 {
		o.LeaseRenewInterval = rules.DefaultLeaseRenewInterval
	}
	if o.BootTimeout <= 0 {
		o.BootTimeout = DefaultBootTimeout
	}
	if o.InstancePollInterval <= 0 {
		o.InstancePollInterval = 250 * time.Millisecond
	}
	switch o.OnShutdown {
	case "":
		o.OnShutdown = ShutdownKeep
	case ShutdownKeep, ShutdownSuspend:
	default:
		return fmt.Errorf("--on-shutdown %q: must be keep or suspend", o.OnShutdown)
	}
	if o.SuspendTimeout <= 0 {
		o.SuspendTimeout = DefaultSuspendTimeout
	}
	return o.snapshotDefaults()
}
