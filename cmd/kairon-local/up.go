package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/zyvor/kairon/config/crd"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/userimages"
)

// defaultPort is tried on a data dir's first start; later starts reuse the
// port that data dir recorded, so kubeconfigs copied elsewhere stay valid.
const defaultPort = 6443

type upFlags struct {
	dataDir string
	binDir  string
	port    int
	nodes   int
	node    nodeOptions
	// nodeGrace is kairon-controller's -node-grace-period.
	nodeGrace time.Duration
	// controllerPprof is kairon-controller's -pprof-bind-address; empty
	// leaves profiling off.
	controllerPprof string
	// apiServerProfiling is kube-apiserver's --profiling.
	apiServerProfiling bool
	verbose            bool
	// kairon-ui, with the agents: on 127.0.0.1:uiPort as the admin.
	ui           bool
	uiPort       int
	uiAllowWrite bool
	// registry: the OCI registry and the images users start from.
	registry registryOptions
}

func up(args []string, stdout, stderr io.Writer) int {
	var f upFlags
	fs := flag.NewFlagSet("kairon-local up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.dataDir, "data-dir", ".kairon", "directory for all state (etcd data, certificates, kubeconfig, logs); kept across restarts")
	fs.StringVar(&f.binDir, "bin-dir", "", "directory with etcd, kube-apiserver and kube-controller-manager\n(default: kairon-local's own directory if they are there, else ./bin)")
	fs.IntVar(&f.port, "port", 0, fmt.Sprintf("API server port on 127.0.0.1 (default: the port the data dir used last time, else %d if free, else any free port)", defaultPort))
	fs.IntVar(&f.nodes, "nodes", 2, "number of kairon-node agents to run, with kairon-controller (0: the control plane alone)")
	fs.StringVar(&f.node.backend, "backend", "qemu", "VM backend of the agents: qemu, or sim (hollow nodes, for control-plane scale tests only)")
	fs.StringVar(&f.node.acceleration, "acceleration", "auto", "qemu acceleration: auto (probe KVM, fall back to TCG), kvm or tcg")
	fs.StringVar(&f.node.guestDir, "guest-dir", "", "guest images (default: guest/ in the bin dir, where `make guest` puts them)")
	fs.StringVar(&f.node.netns, "netns", "", "keep every node's bridge, taps and VMs in this existing network namespace")
	fs.IntVar(&f.node.cpu, "node-cpu", 4, "vCPUs each node offers to Machines")
	fs.StringVar(&f.node.memory, "node-memory", "4Gi", "memory each node offers to Machines")
	fs.StringVar(&f.node.dnsUpstream, "egress-dns-upstream", "auto", "resolver (host:port) the nodes' egress DNS proxies forward the allowed queries of confined guests to, and guests' nameserver; auto: the first nameserver of /etc/resolv.conf, or of systemd-resolved's list when that is its local stub")
	fs.DurationVar(&f.nodeGrace, "node-grace-period", rules.DefaultNodeGracePeriod, "how long an agent may go without renewing its Lease before its node is Unknown (kairon-controller's -node-grace-period; docs/guides/node-failure.md)")
	fs.StringVar(&f.controllerPprof, "controller-pprof-address", "", "serve kairon-controller's Go profiles (/debug/pprof/) on this loopback address, for example 127.0.0.1:6060 (off by default; unauthenticated, so loopback only)")
	fs.BoolVar(&f.apiServerProfiling, "apiserver-profiling", false, "serve kube-apiserver's Go profiles at /debug/pprof/ on the API server's port, to the admin kubeconfig (for benchmarks)")
	fs.DurationVar(&f.node.leaseRenew, "lease-renew-interval", rules.DefaultLeaseRenewInterval, "how often each agent renews its Lease; well under --node-grace-period")
	fs.BoolVar(&f.ui, "ui", true, "run kairon-ui, the web dashboard, with the agents (as the admin kubeconfig, on 127.0.0.1 only)")
	fs.IntVar(&f.uiPort, "ui-port", 8090, "kairon-ui's port on 127.0.0.1")
	fs.BoolVar(&f.uiAllowWrite, "ui-allow-write", true, "kairon-ui's actions (evacuate, migrate, scale) on the pages, made as the admin")
	fs.BoolVar(&f.registry.enabled, "registry", true, "run an OCI registry (Debian's docker-registry) on --registry-address, storage in the data dir, holding the images users start from (kairon/python:3.11), built the first time and cached after (docs/guides/images.md)")
	fs.StringVar(&f.registry.address, "registry-address", defaultRegistryAddress, "the registry's address, on this machine only (plain HTTP, no authentication); if the default is taken, kairon-local runs without a registry and says so")
	fs.StringVar(&f.registry.imageCache, "image-cache", "", "where the images users start from are built and cached (default $KAIRON_IMAGES_CACHE, else ~/.cache/kairon/images)")
	fs.BoolVar(&f.verbose, "v", false, "log each startup step")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: kairon-local up [flags]\n\nStarts the control plane with Kairon's CRDs and runs until Ctrl-C or SIGTERM,\nwhich save every VM and stop it; the next up resumes them.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kairon-local up: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "registry-address" || fl.Name == "registry" {
			f.registry.explicit = true
		}
	})
	if f.port < 0 || f.port > 65535 {
		fmt.Fprintf(stderr, "kairon-local: --port %d is not a TCP port\n", f.port)
		return 2
	}
	if err := runUp(f, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kairon-local: %v\n", err)
		return 1
	}
	return 0
}

func runUp(f upFlags, stdout, stderr io.Writer) error {
	if f.binDir == "" {
		f.binDir = defaultBinDir()
	}
	if f.node.guestDir == "" {
		f.node.guestDir = filepath.Join(f.binDir, "guest")
	}
	dataDir, err := filepath.Abs(f.dataDir)
	if err != nil {
		return err
	}
	f.dataDir = dataDir
	comps, err := components(f)
	if err != nil {
		return err
	}
	if err := checkRegistry(&f.registry, func(msg string) { fmt.Fprintln(stderr, "kairon-local: warning:", msg) }); err != nil {
		return err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	// QEMU nodes put their VMs on a guest network; sim nodes have none.
	guestVMs := f.nodes > 0 && f.node.backend != "sim"
	if guestVMs {
		if err := guestNetworkFree(f.node.netns, f.dataDir); err != nil {
			return err
		}
	}

	// VMs of data dirs deleted under them run on, unmanaged, until killed:
	// say so, since this is where someone who deleted one looks next.
	if vms, err := findVMs(); err == nil {
		warnOrphans(stderr, orphans(vms, dirExists))
	}

	fmt.Fprintf(stderr, "kairon-local: starting the control plane in %s ...\n", f.dataDir)
	began := time.Now()
	cp, err := controlplane.Start(ctx, controlplane.Options{
		DataDir:                f.dataDir,
		BinDir:                 f.binDir,
		APIServerPort:          f.port,
		PreferredAPIServerPort: defaultPort,
		ControllerManager:      true,
		CRDs:                   crd.Bases,
		// Each component as itself, confined like the chart's.
		KaironAccess:       true,
		APIServerProfiling: f.apiServerProfiling,
		Log:                log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted while starting; everything started was stopped again")
		}
		return err
	}
	if guestVMs {
		// Where the agents put the guests' bridge, taps and nftables
		// tables, for `down --purge` (guest_network.go).
		if err := recordGuestNetwork(f.dataDir, f.node.netns); err != nil {
			return errors.Join(err, cp.Stop())
		}
	}
	// The registry comes before the agents, which may pull from it as they
	// resume their VMs.
	var registry *controlplane.Process
	stopRegistry := func() {}
	var registryDied <-chan error
	if f.registry.enabled {
		if registry, err = startRegistry(ctx, cp, f.registry.address); err != nil {
			return errors.Join(fmt.Errorf("starting the registry: %w", err), cp.Stop())
		}
		stopRegistry = func() { registry.Stop(10 * time.Second) }
		registryDied = registry.Done()
	}
	// The images users start from are built or pushed while the
	// components start.
	type ensured struct {
		results []userimages.Result
		err     error
	}
	imagesDone := make(chan ensured, 1)
	imagesCtx, cancelImages := context.WithCancel(ctx)
	defer cancelImages()
	if registry != nil {
		go func() {
			r, err := ensureImages(imagesCtx, f.registry.address, f.registry.imageCache, stderr)
			imagesDone <- ensured{r, err}
		}()
	} else {
		imagesDone <- ensured{}
	}
	set := newComponentSet(stderr)
	if err := set.start(ctx, cp, comps); err != nil {
		cancelImages()
		<-imagesDone // a build in progress stops at its next step
		stopRegistry()
		return errors.Join(err, cp.Stop())
	}
	// `kairon-local node stop/kill/start` reach this run through a socket
	// in the data dir; without it the rest still works.
	closeControl := func() {}
	if f.nodes > 0 {
		if closeControl, err = serveNodeControl(ctx, set, cp); err != nil {
			fmt.Fprintf(stderr, "kairon-local: warning: 'kairon-local node' commands are not available: %v\n", err)
			closeControl = func() {}
		}
	}
	ui := ""
	if f.ui && f.nodes > 0 {
		ui = uiURL(f.uiPort)
	}
	images := <-imagesDone
	if ctx.Err() == nil {
		regLine := ""
		if registry != nil {
			regLine = imagesLine(f.registry.address, images.results, images.err)
		}
		printHowTo(stdout, cp, f.binDir, ui, regLine, time.Since(began))
	}

	var failure error
	select {
	case <-ctx.Done():
	case failure = <-cp.Wait():
	case failure = <-set.Done():
	case failure = <-registryDied:
	}
	// A second Ctrl-C now kills kairon-local outright; the children follow
	// it through Pdeathsig, so nothing is left behind either way.
	stopSignals()
	closeControl()
	if f.nodes > 0 {
		fmt.Fprintln(stderr, "kairon-local: stopping; the node agents save their VMs first ...")
	} else {
		fmt.Fprintln(stderr, "kairon-local: stopping ...")
	}
	// The agents stop (and save their VMs, writing events) before the
	// control plane they need for that.
	stopErr := set.stop()
	stopRegistry()
	stopErr = errors.Join(stopErr, cp.Stop())
	reportVMs(stderr, cp.DataDir())
	if failure != nil {
		return errors.Join(failure, stopErr)
	}
	if stopErr != nil {
		return stopErr
	}
	fmt.Fprintln(stderr, "kairon-local: stopped; state is kept in", cp.DataDir())
	return nil
}

// reportVMs says, once everything stopped, how many VMs were saved and
// which still run because their agent did not save them (it was down, or
// the save failed).
func reportVMs(w io.Writer, dataDir string) {
	records, _ := filepath.Glob(filepath.Join(dataDir, "nodes", "*", "suspended", "*.json"))
	if n := len(records); n > 0 {
		fmt.Fprintf(w, "kairon-local: %d VM(s) saved; the next 'kairon-local up' resumes them\n", n)
	}
	vms, err := findVMs()
	if err != nil {
		return
	}
	for _, vm := range vmsOf(vms, dataDir) {
		if vm.Deleted {
			continue
		}
		fmt.Fprintf(w, "kairon-local: warning: VM %s (pid %d) still runs: its agent did not save it (the agent was down, or the save failed: see %s). The next 'up' adopts it; 'kairon-local down' stops it.\n",
			vm.Name, vm.PID, filepath.Join(dataDir, "logs"))
	}
}

// defaultBinDir prefers the binaries next to kairon-local, which is where an
// installed or `make`-built kairon-local finds them, and falls back to the
// checkout's bin/ when run with `go run`.
func defaultBinDir() string {
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			dir := filepath.Dir(exe)
			if _, err := os.Stat(filepath.Join(dir, controlplane.KubeAPIServer)); err == nil {
				return dir
			}
		}
	}
	if abs, err := filepath.Abs("bin"); err == nil {
		return abs
	}
	return "bin"
}

func printHowTo(w io.Writer, cp *controlplane.ControlPlane, binDir, ui, registry string, took time.Duration) {
	kubectl := filepath.Join(binDir, "kubectl")
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, kubectl); err == nil && !strings.HasPrefix(rel, "..") {
			kubectl = rel
		}
	}
	fmt.Fprintf(w, `
kairon-local is up (%s): API server %s

  export KUBECONFIG=%s
  %s get crd
%s%s
Data, certificates and logs are in %s.
Press Ctrl-C to stop (or send SIGTERM, or run 'kairon-local down --data-dir %s'): every VM is saved,
and the next 'kairon-local up' continues where this one stopped.
`, took.Round(100*time.Millisecond), cp.RESTConfig().Host, cp.KubeconfigPath(), kubectl, uiLine(ui), registry, cp.DataDir(), cp.DataDir())
}

// uiLine is the how-to's line about kairon-ui, if it runs.
func uiLine(url string) string {
	if url == "" {
		return ""
	}
	return "\nDashboard (kairon-ui, as the admin, on this machine only): " + url + "\n"
}
