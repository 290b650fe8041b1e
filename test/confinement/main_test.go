// Package confinement_test attacks Kairon's RBAC roles and admission
// policies (config/rbac, config/admission) on a real kube-apiserver, with
// the credentials a node agent, kairon-controller and a tenant really
// have: what each may write, and that the API server refuses the rest.
package confinement_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/zyvor/kairon/config/crd"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv/host"
)

var (
	once     sync.Once
	shared   *controlplane.ControlPlane
	startErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		_ = os.RemoveAll(shared.DataDir())
	}
	os.Exit(code)
}

// controlPlane is the package's control plane, started on first use as
// kairon-local starts it: Kairon's CRDs, roles and policies, and no
// admission webhook.
func controlPlane(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	host.SkipIfShort(t, "a control plane (etcd, kube-apiserver)")
	once.Do(func() {
		binDir, err := host.LocateBinDir()
		if err != nil {
			startErr = err
			return
		}
		dir, err := os.MkdirTemp("", "kairon-confinement-")
		if err != nil {
			startErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared, startErr = controlplane.Start(ctx, controlplane.Options{
			DataDir: dir, BinDir: binDir, CRDs: crd.Bases, KaironAccess: true, ControllerManager: true, EtcdUnsafeNoFsync: true,
			Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if startErr != nil {
			_ = os.RemoveAll(dir)
		}
	})
	if startErr != nil {
		t.Fatalf("control plane: %v", startErr)
	}
	return shared
}
