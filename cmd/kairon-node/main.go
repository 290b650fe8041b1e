package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/qemu"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/images"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/node/imagepull"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/rules"
)

type flags struct {
	kubeconfig   string
	nodeName     string
	register     bool
	backend      string
	acceleration string
	simBootDelay time.Duration
	stateDir     string
	guestDir     string
	cpu          int64
	memory       string
	networkCIDR  string
	addressPool  string
	bridge       string
	netns        string
	clusterCIDR  string
	nodePrefix   int
	crossNode    string
	crossAddress string
	vxlanID      int
	vxlanPort    int
	egressDNS    uint
	egressMinTTL time.Duration
	egressSNI    uint
	egressUp     string
	metrics      string
	masquerade   string
	noNetwork    bool
	allowMeta    bool
	listen       string
	healthProbe  string
	clientCA     string
	migListen    string
	migTLSDir    string
	migInsecure  bool
	nodeIP       string
	interval     time.Duration
	onShutdown   string
	suspendLimit time.Duration
	qemuNoJail   bool
	cgroupParent string
	vmScope      string
	leaseRenew   time.Duration
	bootTimeout  time.Duration
	snapDir      string
	snapStore    string
	imageDir     string
	imageBudget  string
	imageMaxComp string
	imageMaxSize string
	insecureRegs stringList
	pullCredsURL string
	pullCredsCA  string
}

// stringList is a flag given once per value, or with values separated by
// commas.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kairon-node:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	hostname, _ := os.Hostname()
	var f flags
	fs := flag.NewFlagSet("kairon-node", flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig to reach the API server (empty: in-cluster)")
	fs.StringVar(&f.nodeName, "node-name", hostname, "name of the Node this agent serves")
	fs.BoolVar(&f.register, "register", false, "create and own the Node object (kairon-local); otherwise label the existing Node")
	fs.StringVar(&f.backend, "backend", "qemu", "VM backend: qemu, or sim for control-plane scale tests only")
	fs.StringVar(&f.acceleration, "acceleration", "auto", "qemu acceleration: auto (probe KVM, fall back to TCG), kvm or tcg")
	fs.DurationVar(&f.simBootDelay, "sim-boot-delay", 2*time.Second, "sim backend: time from start to Running")
	fs.StringVar(&f.stateDir, "state-dir", "/var/lib/kairon-node", "state that survives restarts: VMs, addresses, TLS key")
	fs.StringVar(&f.guestDir, "guest-dir", defaultGuestDir(), "directory of guest images (<image>/vmlinux, <image>/initramfs.cpio.gz)")
	fs.Int64Var(&f.cpu, "cpu", int64(runtime.NumCPU()), "vCPUs to offer Machines on a registered Node")
	fs.StringVar(&f.memory, "memory", "8Gi", "memory to offer Machines on a registered Node")
	fs.StringVar(&f.networkCIDR, "network-cidr", "10.88.0.0/24", "IPv4 network of this node's guests; the first address is the bridge's")
	fs.StringVar(&f.addressPool, "address-pool", "", "part of --network-cidr this node hands out (empty: all of it); for nodes sharing one network and bridge")
	fs.StringVar(&f.bridge, "bridge", "kairon0", "name of the node's bridge")
	fs.StringVar(&f.netns, "netns", "", "keep the bridge, taps and VMs in this existing network namespace")
	fs.BoolVar(&f.noNetwork, "no-network", false, "run VMs without a network interface")
	fs.BoolVar(&f.allowMeta, "allow-guest-metadata", false, "let guests reach the cloud metadata addresses through the node (169.254.0.0/16, 100.100.100.200, 168.63.129.16, 192.0.0.192),\nwhere a cloud answers with the node's own credentials (default: dropped for every guest, before any policy; docs/guides/networking.md)")
	fs.StringVar(&f.clusterCIDR, "cluster-guest-cidr", "", "IPv4 range of every node's guests (e.g. 10.88.0.0/16): this node claims a subnet of it (--node-guest-prefix) and its bridge is the range's first address;\nreplaces --network-cidr and --address-pool (empty: off; docs/guides/networking.md)")
	fs.IntVar(&f.nodePrefix, "node-guest-prefix", 24, "length of the subnet of --cluster-guest-cidr each node claims")
	fs.StringVar(&f.crossNode, "cross-node-routing", "none", "how guests reach other nodes' guests (needs --cluster-guest-cidr): host (routes to the nodes' addresses; nodes on one link),\nvxlan (a VXLAN tunnel to each node; nodes behind routers) or none")
	fs.StringVar(&f.crossAddress, "cross-node-address", "", "this node's IPv4 address that other nodes send its guests' traffic to (empty: the Node's InternalIP); in vxlan mode also the tunnels' local end (empty: --node-ip)")
	fs.IntVar(&f.vxlanID, "vxlan-id", 4242, "VXLAN network id of --cross-node-routing=vxlan (the same on every node)")
	fs.IntVar(&f.vxlanPort, "vxlan-port", 4789, "UDP port of --cross-node-routing=vxlan (the same on every node)")
	fs.UintVar(&f.egressDNS, "egress-dns-port", 0, "port of the DNS proxy for guests confined by a MachineNetworkPolicy, in the bridge's namespace; their DNS is redirected to it (0: no proxy, allowFqdns learns nothing; docs/guides/egress.md)")
	fs.StringVar(&f.egressUp, "egress-dns-upstream", "auto", "resolver (host:port) the egress DNS proxy forwards allowed queries to, and guests' nameserver (docs/guides/networking.md); \"auto\": the first nameserver of /etc/resolv.conf, or of systemd-resolved's list when that is its local stub")
	fs.UintVar(&f.egressSNI, "egress-sni-port", 0, "port of the SNI proxy for guests confined by a MachineNetworkPolicy with allowSNI, in the bridge's namespace (0: no proxy, and TCP that only an allowSNI grant allows is dropped; docs/guides/egress.md)")
	fs.DurationVar(&f.egressMinTTL, "egress-dns-min-ttl", egress.DefaultMinTTL, fmt.Sprintf("the shortest an address learned from a DNS answer for an allowFqdns name stays allowed: shorter TTLs are raised to it\n(plus %s of grace; at most %s; docs/guides/egress.md)", egress.DefaultGrace, egress.DefaultMaxTTL))
	fs.StringVar(&f.masquerade, "egress-masquerade", "auto", "uplink interface on which guests' traffic leaves with the node's address (masquerade), with IPv4 forwarding on;\n\"auto\": the interface of the default route, if there is one; \"none\": no NAT (docs/guides/egress.md)")
	fs.StringVar(&f.metrics, "metrics-bind-address", "", "address serving Prometheus metrics (kairon_egress_denied_total, the egress apply and report durations) over plain HTTP (empty: off); bind it to the node's own address, not the guests' gateway")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:10250", "address serving consoles to the API server's node proxy")
	fs.StringVar(&f.healthProbe, "health-probe-bind-address", "", "address serving /healthz and /readyz for liveness and readiness probes (empty: off); bind it to the node's own address, not the guests' gateway")
	fs.StringVar(&f.clientCA, "client-ca-file", "", "accept console requests only with a client certificate signed by this CA")
	fs.StringVar(&f.migListen, "migration-listen", "", "accept migrations from other agents on this host:port (empty: none); without a host (\":10251\", \"0.0.0.0:10251\") it binds to the node's InternalIP only (--node-ip), never to every address")
	fs.StringVar(&f.nodeIP, "node-ip", "", "the node's InternalIP, where a --migration-listen without a host binds (empty: the Node's status.addresses; with --register, the --listen host)")
	fs.StringVar(&f.migTLSDir, "migration-tls-dir", "", "directory with tls.crt, tls.key and ca.crt: live migrations between agents use mutual TLS;\ntls.crt must name this node (CN or DNS SAN = --node-name), peers check it (empty: plain TCP, refused unless --migration-insecure or a loopback --migration-listen)")
	fs.BoolVar(&f.migInsecure, "migration-insecure", false, "FOR TESTS ONLY: accept and send live migrations in plain TCP without --migration-tls-dir, unauthenticated, on any address")
	fs.DurationVar(&f.interval, "interval", 5*time.Second, "reconcile tick")
	fs.DurationVar(&f.leaseRenew, "lease-renew-interval", rules.DefaultLeaseRenewInterval, "how often the agent renews its Lease (kube-node-lease/kairon-<node>); keep it well under kairon-controller's -node-grace-period")
	fs.DurationVar(&f.bootTimeout, "boot-timeout", node.DefaultBootTimeout, "fail a Machine whose VM has not reached Running this long after the first start attempt;\nstart errors that can pass (address, tap, disk space) are retried with backoff until then (docs/guides/node-failure.md)")
	fs.StringVar(&f.snapDir, "snapshot-dir", "", "where MachineSnapshots this agent takes are written and those it restores are read (empty: <state-dir>/machinesnapshots);\nput it on storage other nodes reach, with the same --snapshot-store there, so a snapshot outlives this node (docs/guides/snapshots.md)")
	fs.StringVar(&f.snapStore, "snapshot-store", "", "name of the storage --snapshot-dir is: every agent with the same name must see the same files there;\nthe scheduler restores a snapshot only on nodes of its store (empty: node.<node-name>, this node alone)")
	fs.StringVar(&f.onShutdown, "on-shutdown", string(node.ShutdownKeep), "what a graceful stop (SIGTERM, Ctrl-C) does to the VMs: keep (leave them running for the next agent to adopt,\nas a DaemonSet rollout wants) or suspend (save each VM's state to --state-dir and stop it; the next agent restores it)")
	fs.DurationVar(&f.suspendLimit, "suspend-timeout", node.DefaultSuspendTimeout, "with --on-shutdown=suspend, how long saving the VMs may take; a VM not saved by then keeps running")
	fs.BoolVar(&f.qemuNoJail, "qemu-no-jail", false, "run QEMU unconfined as the agent's own user, for an agent that is not root (development only);\nby default each VM's QEMU has its own uid, seccomp, a chroot and a cgroup (docs/guides/vm-isolation.md)")
	fs.StringVar(&f.cgroupParent, "cgroup-parent", qemu.DefaultCgroupParent, "cgroup (relative to each hierarchy's root) under which each VM gets its own")
	fs.StringVar(&f.vmScope, "vm-scope", "agent", "where the VMs' cgroups live: agent (the hierarchies as this process sees /sys/fs/cgroup) or host (the host's whole hierarchies,\nmounted afresh, for an agent in a container with hostPID: VMs outlive the container; docs/design/node-agent-lifecycle.md)")
	fs.StringVar(&f.imageDir, "image-dir", "", "cache of the OCI images Machines boot (spec.image with a registry), converted to read-only filesystems\n(empty: <state-dir>/images; docs/guides/images.md)")
	fs.StringVar(&f.pullCredsURL, "pull-credentials-url", "", "ask kairon-controller at this URL (https://<controller service>:9443/pull-credentials) for the pull secrets of this node's Machines,\nwith this agent's bearer token, instead of reading the Secrets: for agents that share one ServiceAccount (the Helm chart; docs/guides/images.md)")
	fs.StringVar(&f.pullCredsCA, "pull-credentials-ca", "", "with --pull-credentials-url, the PEM CA certificate that signed kairon-controller's webhook certificate (empty: the system's CAs)")
	fs.StringVar(&f.imageBudget, "image-disk-budget", "20Gi", "disk the image cache may use: above it, images no Machine or MachineSnapshot needs are removed, least recently used first")
	fs.StringVar(&f.imageMaxComp, "image-max-compressed-size", "2Gi", "refuse OCI images whose layers, compressed, add up to more than this")
	fs.StringVar(&f.imageMaxSize, "image-max-size", "8Gi", "refuse OCI images whose files, uncompressed, add up to more than this")
	fs.Var(&f.insecureRegs, "insecure-registry", "registry host:port spoken to over plain HTTP (repeat or separate with commas); loopback registries always may be")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(false)))

	if f.vmScope != "agent" && f.vmScope != "host" {
		return fmt.Errorf("--vm-scope %q: must be agent or host", f.vmScope)
	}
	switch node.ShutdownAction(f.onShutdown) {
	case node.ShutdownKeep, node.ShutdownSuspend:
	default:
		return fmt.Errorf("--on-shutdown %q: must be keep or suspend", f.onShutdown)
	}
	if err := node.CheckMigrationTransport(f.migListen, f.migTLSDir, f.migInsecure); err != nil {
		return err
	}
	memory, err := resource.ParseQuantity(f.memory)
	if err != nil {
		return fmt.Errorf("--memory %q: %w", f.memory, err)
	}
	var network *node.NetworkOptions
	if !f.noNetwork {
		cidr, err := netip.ParsePrefix(f.networkCIDR)
		if err != nil {
			return fmt.Errorf("--network-cidr %q: %w", f.networkCIDR, err)
		}
		var pool netip.Prefix
		if f.addressPool != "" {
			if pool, err = netip.ParsePrefix(f.addressPool); err != nil {
				return fmt.Errorf("--address-pool %q: %w", f.addressPool, err)
			}
		}
		network = &node.NetworkOptions{CIDR: cidr, Pool: pool, Bridge: f.bridge, NetNS: f.netns, NoLinks: f.backend == "sim", AllowGuestMetadata: f.allowMeta}
		if err := crossNodeFlags(f, network); err != nil {
			return err
		}
	}
	b, err := newBackend(f)
	if err != nil {
		return err
	}
	if f.egressDNS > 65535 {
		return fmt.Errorf("--egress-dns-port %d: must be a port, 1-65535 (0: no proxy)", f.egressDNS)
	}
	if f.egressSNI > 65535 {
		return fmt.Errorf("--egress-sni-port %d: must be a port, 1-65535 (0: no proxy)", f.egressSNI)
	}
	if f.egressMinTTL < time.Second || f.egressMinTTL > egress.DefaultMaxTTL {
		return fmt.Errorf("--egress-dns-min-ttl %s: must be from 1s to %s", f.egressMinTTL, egress.DefaultMaxTTL)
	}
	if f.egressSNI != 0 && f.egressSNI == f.egressDNS {
		return fmt.Errorf("--egress-sni-port %d: the DNS proxy has this port already", f.egressSNI)
	}
	upstream := f.egressUp
	if upstream == "auto" {
		// Also without the DNS proxy: guests are told to resolve with it
		// (docs/guides/networking.md). Only the proxy cannot do without it.
		var resolvErr error
		if upstream, resolvErr = egress.AutoUpstream(); resolvErr != nil && f.egressDNS != 0 {
			return fmt.Errorf("--egress-dns-upstream auto: %w; name the resolver", resolvErr)
		}
	}
	if f.egressDNS != 0 && upstream == "" {
		return errors.New("--egress-dns-upstream is required with --egress-dns-port")
	}
	masquerade := f.masquerade
	if masquerade == "none" {
		masquerade = ""
	}
	egressOpts := &node.EgressOptions{DNSPort: uint16(f.egressDNS), DNSUpstream: upstream, SNIPort: uint16(f.egressSNI), Masquerade: masquerade, DNSMinTTL: f.egressMinTTL}
	cfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	if cfg.QPS == 0 {
		// As kairon-controller (controller-runtime's GetConfig): no
		// client-side limit, the API server's priority and fairness
		// applies. client-go's default of 5 requests a second would queue
		// a busy node's status writes and migrations for seconds.
		cfg.QPS, cfg.Burst = -1, -1
	}
	if f.pullCredsURL != "" {
		// Checked now: a wrong flag or a kubeconfig without a token
		// would otherwise only show in the first private pull.
		if _, err := node.NewPullCredentialsClient(f.pullCredsURL, f.pullCredsCA, cfg); err != nil {
			return fmt.Errorf("--pull-credentials-url: %w", err)
		}
	} else if f.pullCredsCA != "" {
		return errors.New("--pull-credentials-ca needs --pull-credentials-url")
	}
	imageStore, err := newImageStore(f)
	if err != nil {
		return err
	}
	defer imageStore.Close()
	agent, err := node.New(cfg, node.Options{
		Images:   imagepull.StoreOf(imageStore),
		NodeName: f.nodeName, Register: f.register, Backend: b, GuestDir: f.guestDir,
		StateDir: f.stateDir, CPU: f.cpu, Memory: memory, Network: network, Egress: egressOpts, MetricsAddress: f.metrics,
		ListenAddress: f.listen, ClientCAFile: f.clientCA, Interval: f.interval, HealthProbeAddress: f.healthProbe,
		MigrationListenAddress: f.migListen, MigrationTLSDir: f.migTLSDir, MigrationInsecure: f.migInsecure, NodeIP: f.nodeIP,
		OnShutdown: node.ShutdownAction(f.onShutdown), SuspendTimeout: f.suspendLimit,
		LeaseRenewInterval: f.leaseRenew, BootTimeout: f.bootTimeout,
		SnapshotDir: f.snapDir, SnapshotStore: f.snapStore,
		PullCredentialsURL: f.pullCredsURL, PullCredentialsCAFile: f.pullCredsCA,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx)
}

func newBackend(f flags) (backend.Backend, error) {
	dir := filepath.Join(f.stateDir, "instances")
	switch f.backend {
	case "qemu":
		// The backend's own log (guests reset, adopted VMs, watchers) goes
		// where the agent's does.
		logger := slog.New(logr.ToSlogHandler(ctrl.Log.WithName("qemu")))
		return qemu.New(qemu.Options{StateDir: dir, GuestDir: f.guestDir, Acceleration: f.acceleration, NetNS: f.netns,
			NoJail: f.qemuNoJail, CgroupParent: f.cgroupParent, HostScope: f.vmScope == "host", Log: logger})
	case "sim":
		return sim.New(sim.Options{StateDir: dir, BootDelay: f.simBootDelay})
	default:
		return nil, fmt.Errorf("--backend %q: must be qemu or sim", f.backend)
	}
}

// newImageStore opens the node's OCI image cache of the --image-* flags.
func newImageStore(f flags) (*images.Store, error) {
	var budget, maxComp, maxSize int64
	for flagName, v := range map[string]struct {
		value string
		into  *int64
	}{"image-disk-budget": {f.imageBudget, &budget}, "image-max-compressed-size": {f.imageMaxComp, &maxComp}, "image-max-size": {f.imageMaxSize, &maxSize}} {
		q, err := resource.ParseQuantity(v.value)
		if err != nil || q.Sign() <= 0 {
			return nil, fmt.Errorf("--%s %q: must be a positive size such as 20Gi", flagName, v.value)
		}
		*v.into = q.Value()
	}
	dir := f.imageDir
	if dir == "" {
		dir = filepath.Join(f.stateDir, "images")
	}
	store, err := images.NewStore(images.Options{
		Dir: dir, DiskBudgetBytes: budget, MaxCompressedBytes: maxComp, MaxUncompressedBytes: maxSize,
		Insecure: f.insecureRegs, Metrics: node.ImageMetrics(f.nodeName), Log: ctrl.Log.WithName("images"),
	})
	if err != nil {
		return nil, fmt.Errorf("--image-dir %s: %w", dir, err)
	}
	return store, nil
}

// defaultGuestDir is bin/guest beside the executable, where `make guest` puts it.
func defaultGuestDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin/guest"
	}
	return filepath.Join(filepath.Dir(exe), "guest")
}

// crossNodeFlags reads the flags of guest networking across nodes into n.
func crossNodeFlags(f flags, n *node.NetworkOptions) error {
	mode, err := network.ParseCrossNodeMode(f.crossNode)
	if err != nil {
		return err
	}
	n.CrossNode, n.NodePrefix, n.VXLANID, n.VXLANPort = mode, f.nodePrefix, f.vxlanID, f.vxlanPort
	if f.clusterCIDR == "" {
		if mode != network.CrossNodeNone {
			return fmt.Errorf("--cross-node-routing=%s needs --cluster-guest-cidr", mode)
		}
		return nil
	}
	if f.addressPool != "" {
		return errors.New("--address-pool and --cluster-guest-cidr: the node's pool is the subnet it claims from --cluster-guest-cidr; give one")
	}
	if n.ClusterCIDR, err = netip.ParsePrefix(f.clusterCIDR); err != nil {
		return fmt.Errorf("--cluster-guest-cidr %q: %w", f.clusterCIDR, err)
	}
	if _, err := network.NewGuestSubnets(n.ClusterCIDR, f.nodePrefix); err != nil {
		return err
	}
	if f.crossAddress != "" {
		if n.CrossNodeAddress, err = netip.ParseAddr(f.crossAddress); err != nil || !n.CrossNodeAddress.Is4() {
			return fmt.Errorf("--cross-node-address %q: not an IPv4 address", f.crossAddress)
		}
	}
	if f.vxlanID < 1 || f.vxlanID > 1<<24-1 {
		return fmt.Errorf("--vxlan-id %d: must be 1-16777215", f.vxlanID)
	}
	if f.vxlanPort < 1 || f.vxlanPort > 65535 {
		return fmt.Errorf("--vxlan-port %d: must be a port, 1-65535", f.vxlanPort)
	}
	return nil
}
