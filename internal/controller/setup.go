package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// DefaultInterval is how often every controller looks at its objects again
// even when no event arrived.
const DefaultInterval = 5 * time.Second

// Options configure SetupWithManager.
type Options struct {
	// Interval is the reconcile tick: every controller also requeues its
	// objects this often, on top of reacting to watch events at once.
	// Zero means DefaultInterval.
	Interval time.Duration
	// Webhook serves the Machine validating webhook at MachineWebhookPath on
	// the manager's webhook server. Registering the
	// ValidatingWebhookConfiguration that points the API server at it is
	// up to the installer. It also serves the MachineMigration webhook at
	// MachineMigrationWebhookPath, and the node agents' policy status one
	// at PolicyStatusWebhookPath, and hands node agents their Machines'
	// pull secrets at PullCredentialsPath.
	Webhook bool
	// NodeServiceAccount is the user of the node agents' shared
	// ServiceAccount (system:serviceaccount:<ns>:<name>), whose Pod-bound
	// tokens name their node; "" if there is none. With Webhook, the
	// webhook server also hands the node agents their Machines' pull
	// secrets at PullCredentialsPath (PullCredentialsHandler).
	NodeServiceAccount string

	// InsecureRegistries (host:port) are asked for pools' image digests
	// over plain HTTP, besides loopback: the nodes' --insecure-registry.
	InsecureRegistries []string

	// CordonEvacuate runs cordon-triggered evacuation: the Machines on a
	// cordoned Kairon node get budget-throttled MachineMigrations.
	CordonEvacuate bool
	// CordonEvacuateStrategy is cold (empty means cold) or auto; live is
	// refused (see CordonEvacuationStrategy).
	CordonEvacuateStrategy string
	// CordonEvacuateMinRetryInterval is the least time between two
	// attempts at one Machine. Zero means DefaultCordonEvacuateMinRetryInterval.
	CordonEvacuateMinRetryInterval time.Duration

	// NodeGracePeriod is how long a node agent may go without renewing
	// its Lease before its node is unreachable (nodehealth_controller.go).
	// Zero means rules.DefaultNodeGracePeriod.
	NodeGracePeriod time.Duration

	// CapacityBooking books each placed Machine's CPU and memory with the
	// kubelet through a pod (capacity_booking.go), when Enabled.
	CapacityBooking CapacityBookingOptions

	// NoMigrationController leaves MachineMigrations alone: nothing picks
	// a target or moves a migration's phase. For tests that drive
	// migration phases by hand.
	NoMigrationController bool

	// snapshotClock is the SnapshotSchedule controller's clock; nil means
	// time.Now. Tests move it instead of waiting for cron slots.
	snapshotClock func() time.Time

	// binds is the bind tracker the claim binder and the claim reconciler
	// share; nil means a new one. Tests set it to drive its clock, and to
	// carry what one manager's watches delivered over to the next.
	binds *bindTracker
}

// SetupWithManager registers every Kairon controller, and the webhook when
// asked, with mgr. The manager's scheme must know the Kairon and core kinds.
func SetupWithManager(mgr manager.Manager, opts Options) error {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	// Checked before anything is registered: a refused strategy sets up nothing.
	cordonStrategy, err := CordonEvacuationStrategy(opts.CordonEvacuateStrategy)
	if opts.CordonEvacuate && err != nil {
		return err
	}
	if err := indexMachines(mgr); err != nil {
		return err
	}
	// The binder and the claim reconciler share what this process knows of
	// binds its cache has yet to show.
	binds := opts.binds
	if binds == nil {
		binds = newBindTracker()
	}
	err = errors.Join(
		(&SchedulerReconciler{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("kairon-scheduler"),
			Interval:  opts.Interval,
		}).SetupWithManager(mgr),
		(&MachineSetReconciler{
			Client:   mgr.GetClient(),
			Recorder: mgr.GetEventRecorder("kairon-machineset-controller"),
			Interval: opts.Interval,
		}).SetupWithManager(mgr),
		(&MachineQuotaReconciler{
			Client:   mgr.GetClient(),
			Interval: opts.Interval,
		}).SetupWithManager(mgr),
		(&MachinePoolReconciler{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("kairon-machinepool-controller"),
			Interval:  opts.Interval,
			Resolver:  RegistryResolver{InsecureRegistries: opts.InsecureRegistries},
		}).SetupWithManager(mgr),
		(&NodePullSecretsReconciler{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
		}).SetupWithManager(mgr),
		(&MachineClaimBinder{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("kairon-machineclaim-binder"),
			Interval:  opts.Interval,
			tracker:   binds,
		}).SetupWithManager(mgr),
		(&MachineClaimReconciler{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("kairon-machineclaim-controller"),
			Interval:  opts.Interval,
			tracker:   binds,
		}).SetupWithManager(mgr),
		(&MachineDisruptionBudgetReconciler{
			Client:   mgr.GetClient(),
			Interval: opts.Interval,
		}).SetupWithManager(mgr),
		(&MigrationEndpointReconciler{
			Client: mgr.GetClient(),
		}).SetupWithManager(mgr),
		(&ClaimEgressEnforcedReconciler{
			Client: mgr.GetClient(),
		}).SetupWithManager(mgr),
		(&PolicyMachinesReconciler{
			Client: mgr.GetClient(),
		}).SetupWithManager(mgr),
		(&MachineSnapshotReconciler{
			Client: mgr.GetClient(),
		}).SetupWithManager(mgr),
		(&SnapshotScheduleReconciler{
			Client:   mgr.GetClient(),
			Recorder: mgr.GetEventRecorder("kairon-snapshotschedule"),
			Interval: opts.Interval,
			Now:      opts.snapshotClock,
		}).SetupWithManager(mgr),
		(&NodeHealthReconciler{
			Client:      mgr.GetClient(),
			APIReader:   mgr.GetAPIReader(),
			Recorder:    mgr.GetEventRecorder("kairon-nodehealth"),
			GracePeriod: opts.NodeGracePeriod,
		}).SetupWithManager(mgr),
		(&FenceReconciler{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("kairon-fence"),
		}).SetupWithManager(mgr),
	)
	if err != nil {
		return err
	}
	if !opts.NoMigrationController {
		if err := (&MachineMigrationReconciler{
			Client:   mgr.GetClient(),
			Recorder: mgr.GetEventRecorder("kairon-migration-controller"),
			Interval: opts.Interval,
		}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if opts.CapacityBooking.Enabled {
		if err := (&CapacityBookingReconciler{
			Client:   mgr.GetClient(),
			Recorder: mgr.GetEventRecorder("kairon-capacity-booking"),
			Options:  opts.CapacityBooking,
		}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if opts.CordonEvacuate {
		if err := (&CordonEvacuationReconciler{
			Client:           mgr.GetClient(),
			APIReader:        mgr.GetAPIReader(),
			Recorder:         mgr.GetEventRecorder("kairon-cordon-evacuation"),
			Strategy:         cordonStrategy,
			MinRetryInterval: opts.CordonEvacuateMinRetryInterval,
			Interval:         opts.Interval,
		}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if opts.Webhook {
		seen := newSeenMachines()
		machines, err := mgr.GetCache().GetInformer(context.Background(), &kaironv1.Machine{})
		if err != nil {
			return fmt.Errorf("watching Machines for the quota charges: %w", err)
		}
		if _, err := machines.AddEventHandler(seen.handler()); err != nil {
			return fmt.Errorf("watching Machines for the quota charges: %w", err)
		}
		mgr.GetWebhookServer().Register(MachineWebhookPath, admission.WithValidator[*kaironv1.Machine](mgr.GetScheme(),
			&MachineValidator{Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(), Seen: seen.seenBefore}))
		mgr.GetWebhookServer().Register(MachineMigrationWebhookPath, NewMachineMigrationWebhook(mgr.GetScheme(), mgr.GetAPIReader()))
		mgr.GetWebhookServer().Register(PolicyStatusWebhookPath, NewPolicyStatusWebhook(mgr.GetScheme(), mgr.GetAPIReader()))
		clientset, err := kubernetes.NewForConfig(mgr.GetConfig())
		if err != nil {
			return fmt.Errorf("client for the pull credentials' token reviews: %w", err)
		}
		mgr.GetWebhookServer().Register(PullCredentialsPath, &PullCredentialsHandler{
			Reader: mgr.GetAPIReader(), Tokens: clientset.AuthenticationV1().TokenReviews(), NodeServiceAccount: opts.NodeServiceAccount,
		})
	}
	return nil
}
