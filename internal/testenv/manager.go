package testenv

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// managerSyncTimeout bounds the wait for a started manager's cache: an
// upper bound for a loaded machine, never a measurement.
const managerSyncTimeout = 2 * time.Minute

// StartManager runs a controller-runtime manager on cfg, set up by setup
// (kairon-controller's SetupWithManager, for instance), until the test
// ends or it calls stop, and returns once the manager's cache has synced.
// Of opts, what the caller left zero gets the tests' choice: the Env's
// scheme, logs into the test's log, and random metrics and health ports,
// since every test of a process starts its own manager.
func (e *Env) StartManager(t testing.TB, cfg *rest.Config, opts ctrl.Options, setup func(ctrl.Manager) error) (stop func()) {
	t.Helper()
	logs := NewLogWriter(t)
	if opts.Scheme == nil {
		opts.Scheme = e.Scheme
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = zap.New(zap.WriteTo(logs), zap.ConsoleEncoder())
	}
	if opts.Metrics.BindAddress == "" {
		opts.Metrics.BindAddress = "0"
	}
	if opts.HealthProbeBindAddress == "" {
		opts.HealthProbeBindAddress = "0"
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatalf("creating manager: %v", err)
	}
	if err := setup(mgr); err != nil {
		t.Fatalf("setting up controllers: %v", err)
	}
	stopManager := RunInBackground(t, "manager", mgr.Start)
	stop = func() {
		stopManager()
		logs.Stop()
	}
	t.Cleanup(stop)
	syncCtx, cancelSync := context.WithTimeout(context.Background(), managerSyncTimeout)
	defer cancelSync()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("manager cache did not sync")
	}
	return stop
}
