package node_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
)

// noProgressSend is a sim backend whose live sends end as QEMU's does when
// the policy's progress timeout cancels one: nothing delivered, the guest
// running on here, ErrMigrationNoProgress. It hands over the options the
// agent gave it.
type noProgressSend struct {
	*sim.Backend
	got chan backend.LiveOptions
}

func (s noProgressSend) SendLive(_ context.Context, _ string, _ io.Writer, opts backend.LiveOptions) (time.Duration, error) {
	s.got <- opts
	return 0, fmt.Errorf("sim: %w", backend.ErrMigrationNoProgress)
}

// TestLiveMigrationAppliesItsMigrationPolicy: the MigrationPolicy that
// selects the Machine reaches the source's backend as LiveOptions (its
// bandwidth, auto-converge, the completion timeout scaled to the Machine's
// 256Mi, the progress timeout); a send the backend cancels for no progress
// fails the migration NoProgress, naming the policy, before the target can
// call it ReceiveFailed, and the guest runs on at the source.
func TestLiveMigrationAppliesItsMigrationPolicy(t *testing.T) {
	got := make(chan backend.LiveOptions, 1)
	wrap := func(o *node.Options) { o.Backend = noProgressSend{o.Backend.(*sim.Backend), got} }
	env, ns, sourceState, targetState, m := startMigrationPair(t, "pol-a", "pol-b", nil, wrap, nil)
	policy := &kaironv1.MigrationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-slow"},
		Spec: kaironv1.MigrationPolicySpec{
			// Only this test's namespace: policies are cluster-wide.
			Selectors:               kaironv1.MigrationPolicySelectors{NamespaceSelector: map[string]string{"kubernetes.io/metadata.name": ns}},
			BandwidthPerMigration:   ptr.To(resource.MustParse("16Mi")),
			CompletionTimeoutPerGiB: ptr.To[int64](40),
			ProgressTimeout:         ptr.To[int64](7),
			AllowAutoConverge:       ptr.To(true),
		},
	}
	if err := env.Client.Create(context.Background(), policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), policy); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})

	mig := migrateLive(t, env, ns, "vm", kaironv1.MigrationFailed)
	want := backend.LiveOptions{MaxBandwidth: 16 << 20, AutoConverge: true, CompletionTimeout: 10 * time.Second, ProgressTimeout: 7 * time.Second}
	select {
	case opts := <-got:
		if opts != want {
			t.Errorf("the backend got %+v, want %+v", opts, want)
		}
	default:
		t.Fatal("the source's backend was never asked to send")
	}
	if p := mig.Status.MigrationPolicy; p == nil || p.Name != policy.Name {
		t.Errorf("status.migrationPolicy %+v, want %s", p, policy.Name)
	}
	if mig.Status.Reason != kaironv1.MigrationReasonNoProgress || !strings.Contains(mig.Status.Message, "cancelled under MigrationPolicy "+policy.Name) ||
		!strings.Contains(mig.Status.Message, "keeps running on pol-a") {
		t.Errorf("failed with %s: %s; want NoProgress naming the policy", mig.Status.Reason, mig.Status.Message)
	}
	guestStayedOnSource(t, env, m, "pol-a", sourceState, targetState)
}
