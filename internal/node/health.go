package node

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The agent's /healthz and /readyz, for the DaemonSet's probes
// (Options.HealthProbeAddress).
//
// Liveness is only that the process serves HTTP: restarting the agent
// because the API server is away would not bring it back, and a restart
// costs the VMs nothing but is not free either. Readiness says the agent is
// doing its job: its cache of Machines is synced and it wrote its Node
// recently, so `kubectl get ds` shows an agent that cannot reach the API
// server, or is stuck, as not ready.

// staleHeartbeats is how many heartbeat intervals may pass without a
// successful Node write before the agent reports itself not ready.
const staleHeartbeats = 3

func (a *Agent) addHealthChecks() error {
	if err := a.mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := a.mgr.AddReadyzCheck("machines-cache-synced", a.cacheSynced); err != nil {
		return err
	}
	return a.mgr.AddReadyzCheck("node-heartbeat", func(*http.Request) error {
		return heartbeatFresh(a.lastNodeSync.Load(), time.Now(), a.opts.HeartbeatInterval)
	})
}

func (a *Agent) cacheSynced(r *http.Request) error {
	informer, err := a.mgr.GetCache().GetInformer(r.Context(), &kaironv1.Machine{}, cache.BlockUntilSynced(false))
	if err != nil {
		return err
	}
	if !informer.HasSynced() {
		return errors.New("the cache of this node's Machines is not synced yet")
	}
	return nil
}

// heartbeatFresh says whether the last successful Node write, at lastNanos
// (Unix nanoseconds, 0: never), is recent enough at now.
func heartbeatFresh(lastNanos int64, now time.Time, interval time.Duration) error {
	if lastNanos == 0 {
		return errors.New("the agent has not written its Node yet")
	}
	last := time.Unix(0, lastNanos)
	if age := now.Sub(last); age > staleHeartbeats*interval {
		return fmt.Errorf("the agent last wrote its Node %s ago (heartbeat every %s)", age.Round(time.Second), interval)
	}
	return nil
}

// healthProbeAddress is the manager's HealthProbeBindAddress for addr: "0"
// turns the server off.
func healthProbeAddress(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}
