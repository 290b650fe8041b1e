// Package controller holds Kairon's control loops: the scheduler that places
// Machines on nodes, the MachineSet and MachineQuota controllers and the
// Machine admission webhook. SetupWithManager registers all of them, so
// kairon-controller, kairon-local and the tests run the same set.
package controller

import (
	"errors"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/manager"
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
	// up to the installer.
	Webhook bool
}

// SetupWithManager registers every Kairon controller, and the webhook when
// asked, with mgr. The manager's scheme must know the Kairon and core kinds.
func SetupWithManager(mgr manager.Manager, opts Options) error {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	err := errors.Join(
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
	)
	if err != nil {
		return err
	}
	if opts.Webhook {
		mgr.GetWebhookServer().Register(MachineWebhookPath, NewMachineWebhook(mgr.GetScheme(), mgr.GetAPIReader()))
	}
	return nil
}
