package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/node/imagepull"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/requeue"
)

// Agent is one running kairon-node.
type Agent struct {
	opts       Options
	mgr        manager.Manager
	client     client.Client
	ipam       *network.IPAM
	links      *network.Links
	recorder   recorder.EventRecorder
	listener   net.Listener
	listenAddr string
	// migrationListener accepts live migrations; migrationTLS secures them.
	migrationListener net.Listener
	migrationTLS      *migrationTLS
	// consoleAuth authenticates and authorizes console requests.
	consoleAuth *consoleAuth
	// baseline is the guests' firewall on the bridge (nil without links).
	baseline *network.Baseline
	// crossNode routes to other nodes' guests (crossnode_routes.go); nil
	// without a cluster guest range.
	crossNode *crossNode
	// addresses is every guest address of the cluster
	// (guest_addresses.go); nil where guests have no network.
	addresses *guestAddresses
	// egress enforces MachineNetworkPolicies (egress_controller.go); nil
	// without a node network. dnsProxy answers confined guests' DNS;
	// sniProxy checks the server names of their allowSNI connections.
	egress   EgressEnforcer
	dnsProxy *egress.DNSProxy
	sniProxy *egress.SNIProxy
	// nameserver is what guests are told to resolve with (guestNameserver).
	nameserver netip.Addr
	// egressReported is what this agent last wrote in each policy's
	// status.nodes, for the moments its cache is behind its own write.
	egressReported egressReports
	// egressApplied is what the agent applied to each Machine, per policy
	// and generation (egress_applied.go); egressQueue is the egress
	// controller's queue, set when it starts.
	egressApplied egressApplied
	egressQueue   atomic.Pointer[workqueue.TypedRateLimitingInterface[egressKey]]
	// egressDenials counts the refusals the agent makes itself (DNS
	// queries, TLS server names) per Machine, and paces its egress events
	// (egress_metrics.go).
	egressDenials sync.Map
	// receiving holds the migrations (client.ObjectKey) whose stream this
	// agent is taking in, so that a second connection cannot race the first.
	receiving sync.Map
	// imagePuller fetches Machines' OCI images in the background
	// (machine_image.go); nil without Options.Images.
	imagePuller *imagepull.Puller
	// instanceEvents wakes the Machine reconciler when the backend reports a
	// change (guest ready, VM died) so status follows within a poll interval.
	instanceEvents chan event.TypedGenericEvent[*kaironv1.Machine]
	// restConfig is the agent's own credentials.
	restConfig *rest.Config
	// lifecycle is read-held by every Machine reconcile; suspendAll takes it
	// to wait for those in flight. stopping, set first, makes later ones
	// return without acting, so no VM is started or replaced meanwhile.
	lifecycle sync.RWMutex
	stopping  atomic.Bool
	// lastNodeSync is when the agent last wrote its Node (Unix nanoseconds),
	// for readiness (health.go).
	lastNodeSync atomic.Int64
	// boots tracks start attempts for the boot timeout and the retries of
	// transient start errors (boot.go).
	boots bootAttempts
	// savedTemplates remembers the template Machines this agent saved
	// (snapshot.go), for the moments its cache is behind its own write.
	savedTemplates savedTemplates
	// ownWrites is what the Machine reconciler last wrote of each Machine,
	// for the moments its cache is behind its own write (own_writes.go).
	ownWrites ownWrites
	// snapshotting serializes the snapshots of one VM (instance ID to
	// *sync.Mutex, machine_snapshot.go).
	snapshotting sync.Map
}

// New prepares an agent: the node network, the console listener and a
// controller-runtime manager whose cache holds only this node's Machines.
func New(cfg *rest.Config, opts Options) (*Agent, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	a := &Agent{opts: opts, instanceEvents: make(chan event.TypedGenericEvent[*kaironv1.Machine], 1024), restConfig: cfg}
	if opts.Images != nil {
		a.imagePuller = imagepull.NewPuller(opts.Images, a.wakeMachine)
	}

	if err := a.claimGuestNetwork(cfg); err != nil {
		return nil, err
	}
	if n := a.opts.Network; n != nil {
		ipam, err := network.NewIPAM(n.CIDR, n.Pool, filepath.Join(opts.StateDir, "ipam.json"))
		if err != nil {
			return nil, err
		}
		a.ipam = ipam
		if !n.NoLinks {
			a.links = &network.Links{Bridge: n.Bridge, Gateway: ipam.Gateway(), NetNS: n.NetNS, Node: opts.NodeName}
			a.nameserver = guestNameserver(opts.Egress, ipam.Gateway().Addr())
			if err := a.links.EnsureBridge(); err != nil {
				return nil, fmt.Errorf("node network: %w", err)
			}
			// Before any tap: a guest must never send a frame unfiltered.
			a.baseline = &network.Baseline{NetNS: n.NetNS, Bridge: n.Bridge, Network: n.CIDR, Gateway: ipam.Gateway().Addr(),
				Node: opts.NodeName, AllowMetadata: n.AllowGuestMetadata, Nameserver: a.nameserver}
			if eo := opts.Egress; eo != nil {
				a.baseline.ProxyPorts = []uint16{eo.DNSPort, eo.SNIPort}
			}
			if err := a.baseline.Setup(); err != nil {
				return nil, fmt.Errorf("node network: %w", err)
			}
			if err := a.setupEgress(); err != nil {
				return nil, err
			}
			if err := a.setupCrossNodeRoutes(); err != nil {
				return nil, err
			}
		} else {
			a.egress = simEnforcer{}
		}
		if eo := opts.Egress; eo != nil && eo.Enforcer != nil {
			a.egress = eo.Enforcer
		}
		a.setupGuestAddresses()
	}

	if opts.ListenAddress != "" {
		ln, err := net.Listen("tcp", opts.ListenAddress)
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w (is another kairon-node using it?)", opts.ListenAddress, err)
		}
		a.listener = ln
		a.listenAddr = ln.Addr().String()
	}

	if opts.MigrationTLSDir != "" {
		t, err := loadMigrationTLS(opts.MigrationTLSDir)
		if err != nil {
			a.close()
			return nil, err
		}
		a.migrationTLS = t
	}
	if opts.MigrationListenAddress != "" {
		ln, err := a.listenMigration(cfg) // on the InternalIP, never the guests' gateway
		if err != nil {
			a.close()
			return nil, err
		}
		a.migrationListener = ln
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := kaironv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddress(opts.MetricsAddress)},
		HealthProbeBindAddress: healthProbeAddress(opts.HealthProbeAddress),
		Controller:             requeue.ControllerConfig(),
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// The CRD declares spec.nodeName selectable, so each agent watches
			// only its own Machines however large the cluster is.
			&kaironv1.Machine{}: {Field: fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)},
		}},
	})
	if err != nil {
		a.close()
		return nil, err
	}
	a.mgr = mgr
	a.client = mgr.GetClient()
	a.consoleAuth = newConsoleAuth(apiReviewer{c: mgr.GetClient()})
	a.recorder = mgr.GetEventRecorder("kairon-node")
	if err := a.addHealthChecks(); err != nil {
		a.close()
		return nil, err
	}
	if err := a.setupMachineController(); err != nil {
		a.close()
		return nil, err
	}
	if err := a.setupMigrationController(); err != nil {
		a.close()
		return nil, err
	}
	if err := a.setupSnapshotController(); err != nil {
		a.close()
		return nil, err
	}
	if a.egress != nil {
		if err := a.setupEgressController(); err != nil {
			a.close()
			return nil, err
		}
	}
	if err := a.setupGuestAddressController(cfg, scheme); err != nil {
		a.close()
		return nil, err
	}
	if err := a.setupCrossNodeController(); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// Run serves until ctx ends. With Options.OnShutdown ShutdownKeep the VMs
// are left running when it returns; with ShutdownSuspend they are saved and
// stopped first (suspend.go), while the manager still runs.
func (a *Agent) Run(ctx context.Context) error {
	defer a.close()
	// The manager stops only once the VMs are dealt with: suspending them
	// needs its cache and the API server for events.
	mgrCtx, stopManager := context.WithCancel(context.WithoutCancel(ctx))
	defer stopManager()
	go func() {
		select {
		case <-ctx.Done():
		case <-mgrCtx.Done():
			return
		}
		if a.opts.OnShutdown == ShutdownSuspend {
			a.suspendAll(log.IntoContext(context.WithoutCancel(ctx), log.FromContext(ctx).WithName("node-agent")))
		}
		stopManager()
	}()
	// Before the Node says Ready: no VM whose Machine is elsewhere runs on
	// (rejoin_fence.go).
	if err := a.fenceOnRejoin(ctx); err != nil {
		return fmt.Errorf("destroying stale VMs before reporting Ready: %w", err)
	}
	if err := a.syncNode(ctx, true, "AgentReady", "kairon-node is running"); err != nil {
		return fmt.Errorf("registering node %s: %w", a.opts.NodeName, err)
	}
	runnables := []manager.RunnableFunc{a.heartbeat, a.renewLease, a.pollInstances, a.sweepSnapshots, a.sweepTemplateCopies, a.collectImages}
	if a.listener != nil {
		runnables = append(runnables, a.serve)
	}
	if a.migrationListener != nil {
		runnables = append(runnables, a.serveLiveMigrations)
	}
	if a.dnsProxy != nil {
		runnables = append(runnables, a.serveEgressDNS)
	}
	if a.sniProxy != nil {
		runnables = append(runnables, a.serveEgressSNI)
	}
	if _, ok := a.egress.(*egress.Enforcer); ok {
		runnables = append(runnables, a.keepEgress, a.reportEgressDrops)
	}
	if a.egress != nil {
		egressMetrics.add(a)
		defer egressMetrics.remove(a)
	}
	if a.baseline != nil {
		runnables = append(runnables, func(ctx context.Context) error {
			logger := log.FromContext(ctx).WithName("guest-baseline")
			return a.baseline.Keep(ctx, a.opts.Interval, func(err error, msg string) {
				if err != nil {
					logger.Error(err, msg)
				} else {
					logger.Info(msg)
				}
			})
		})
	}
	for _, r := range runnables {
		if err := a.mgr.Add(r); err != nil {
			return err
		}
	}
	return a.mgr.Start(mgrCtx)
}

// Address is where the agent's console server listens, once New returned.
func (a *Agent) Address() string { return a.listenAddr }

func (a *Agent) close() {
	if a.imagePuller != nil {
		a.imagePuller.Stop()
	}
	if a.listener != nil {
		_ = a.listener.Close()
	}
	if a.migrationListener != nil {
		_ = a.migrationListener.Close()
	}
}
