package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kairon-controller:", err)
		os.Exit(1)
	}
}

func run() error {
	// -kubeconfig is registered on flag.CommandLine by controller-runtime
	// and read by ctrl.GetConfig, which falls back to $KUBECONFIG and the
	// in-cluster config.
	var (
		interval         = flag.Duration("interval", controller.DefaultInterval, "how often every controller re-checks its objects without an event")
		metricsAddr      = flag.String("metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint; "0" turns it off`)
		metricsSecure    = flag.Bool("metrics-secure", false, "serve the metrics over HTTPS, only to bearer tokens whose user may get the non-resource URL /metrics (TokenReview and SubjectAccessReview)")
		metricsCertDir   = flag.String("metrics-cert-dir", "", "with -metrics-secure, directory with tls.crt and tls.key (empty: a self-signed certificate made at start)")
		probeAddr        = flag.String("health-probe-bind-address", ":8081", `address of /healthz and /readyz; "0" turns them off`)
		pprofAddr        = flag.String("pprof-bind-address", "0", `address of Go's profiling endpoints (/debug/pprof/), for example 127.0.0.1:6060; "0" (the default) turns them off. Unauthenticated: bind it to loopback only`)
		leaderElect      = flag.Bool("leader-elect", false, "run only while holding the leader lease, so several replicas can stand by")
		leaderElectionNS = flag.String("leader-election-namespace", "kube-system", "namespace of the leader election lease when not running in a Pod")
		webhookOn        = flag.Bool("webhook", false, "serve the validating webhooks: Machines at "+controller.MachineWebhookPath+", MachineMigrations at "+controller.MachineMigrationWebhookPath+", node agents' MachineNetworkPolicy status reports at "+controller.PolicyStatusWebhookPath+"; and node agents their Machines' pull secrets at "+controller.PullCredentialsPath)
		webhookPort      = flag.Int("webhook-port", webhook.DefaultPort, "port of the webhook server")
		webhookCertDir   = flag.String("webhook-cert-dir", "", "directory with the webhook's tls.crt and tls.key (default: the system temp dir's k8s-webhook-server/serving-certs)")
		cordonEvacuate   = flag.Bool("cordon-evacuate", false, "give every Machine on a cordoned Kairon node a MachineMigration, within the MachineDisruptionBudgets")
		cordonStrategy   = flag.String("cordon-evacuate-strategy", controller.CordonEvacuateCold, "strategy of the migrations -cordon-evacuate creates: cold, or auto (live where the Machine and both nodes can, cold otherwise; each migration's StrategyChosen condition says which and why); live is refused")
		nodeGrace        = flag.Duration("node-grace-period", rules.DefaultNodeGracePeriod, "how long a node agent may go without renewing its Lease (kube-node-lease/kairon-<node>) before its node is unreachable:\nKaironAgentReady Unknown, its Machines NodeReachable=False, nothing new placed there, its warm pool members replaced (docs/guides/node-failure.md)")
		insecureRegs     = flag.String("insecure-registry", "", "registries (host:port, comma-separated) asked for a MachinePool image's digest over plain HTTP, besides loopback: the same as the node agents' --insecure-registry")
		nodeSA           = flag.String("node-service-account", "", "user of the node agents' shared ServiceAccount, system:serviceaccount:<namespace>:<name>: with -webhook, its Pod-bound tokens get the pull secrets of the Machines on their node at "+controller.PullCredentialsPath+" (empty: only kairon:node:<node> users, as kairon-local issues, are node agents)")
		cordonRetry      = flag.Duration("cordon-evacuate-min-retry-interval", controller.DefaultCordonEvacuateMinRetryInterval, "least time between two -cordon-evacuate attempts at one Machine")
	)
	var capacityBooking controller.CapacityBookingOptions
	capacityBooking.BindFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if _, err := controller.CordonEvacuationStrategy(*cordonStrategy); err != nil {
		return err
	}
	if *nodeGrace <= 0 {
		return fmt.Errorf("-node-grace-period must be positive, got %s", *nodeGrace)
	}
	if *cordonRetry <= 0 {
		return fmt.Errorf("-cordon-evacuate-min-retry-interval must be positive, got %s", *cordonRetry)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("kairon-controller")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := kaironv1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("finding the API server (set -kubeconfig or $KUBECONFIG): %w", err)
	}

	mgrOpts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 controller.MetricsServing{BindAddress: *metricsAddr, Secure: *metricsSecure, CertDir: *metricsCertDir}.Options(),
		HealthProbeBindAddress:  *probeAddr,
		PprofBindAddress:        *pprofAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "kairon-controller.kairon.zyvor.dev",
		LeaderElectionNamespace: *leaderElectionNS,
		// The process exits as soon as the manager stops, so handing the
		// lease back at once lets a standby take over without waiting for
		// it to expire.
		LeaderElectionReleaseOnCancel: true,
		Controller:                    requeue.ControllerConfig(),
	}
	if parts := strings.Split(*nodeSA, ":"); *nodeSA != "" && (len(parts) != 4 || !strings.HasPrefix(*nodeSA, "system:serviceaccount:") || parts[2] == "" || parts[3] == "") {
		return fmt.Errorf("-node-service-account %q: want system:serviceaccount:<namespace>:<name>", *nodeSA)
	}
	if *webhookOn {
		mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{Port: *webhookPort, CertDir: *webhookCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	if err := controller.SetupWithManager(mgr, controller.Options{
		Interval:                       *interval,
		Webhook:                        *webhookOn,
		NodeServiceAccount:             *nodeSA,
		CordonEvacuate:                 *cordonEvacuate,
		CordonEvacuateStrategy:         *cordonStrategy,
		CordonEvacuateMinRetryInterval: *cordonRetry,
		NodeGracePeriod:                *nodeGrace,
		CapacityBooking:                capacityBooking,
		InsecureRegistries:             splitList(*insecureRegs),
	}); err != nil {
		return fmt.Errorf("setting up controllers: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	ready := healthz.Ping
	if *webhookOn {
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("ready", ready); err != nil {
		return err
	}

	log.Info("Starting controllers", "apiServer", cfg.Host, "interval", interval.String(), "webhook", *webhookOn, "cordonEvacuate", *cordonEvacuate, "leaderElection", *leaderElect)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("running controllers: %w", err)
	}
	log.Info("Stopped")
	return nil
}

// splitList is a comma-separated flag's values, blanks dropped.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
