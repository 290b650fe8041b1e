package v1alpha1_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/testenv"
)

// The API server's checks of a MigrationPolicy, each naming the field and
// what is wrong with it, and what `kubectl get` shows of one: a 0 is a 0.
func TestMigrationPolicyValidation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t) // names policies uniquely; they are cluster-scoped
	for _, tt := range []struct {
		name, spec string
		want       []string
	}{
		{"bandwidth below 1Ki", `{bandwidthPerMigration: "512"}`, []string{"spec.bandwidthPerMigration", "at least 1Ki (bytes per second)"}},
		{"bandwidth zero", `{bandwidthPerMigration: 0}`, []string{"spec.bandwidthPerMigration", "at least 1Ki"}},
		{"fractional bandwidth", `{bandwidthPerMigration: "1500.5"}`, []string{"spec.bandwidthPerMigration", "whole number of bytes per second"}},
		{"bandwidth not a quantity", `{bandwidthPerMigration: "fast"}`, []string{"spec.bandwidthPerMigration", "quantities must match"}},
		{"completion timeout zero", `{completionTimeoutPerGiB: 0}`, []string{"spec.completionTimeoutPerGiB", "greater than or equal to 1"}},
		{"progress timeout negative", `{progressTimeout: -5}`, []string{"spec.progressTimeout", "greater than or equal to 1"}},
		{"progress timeout over a day", `{progressTimeout: 86401}`, []string{"spec.progressTimeout", "less than or equal to 86400"}},
		{"negative cluster limit", `{maxParallelMigrations: -1}`, []string{"spec.maxParallelMigrations", "greater than or equal to 0"}},
		{"negative node limit", `{maxParallelOutboundPerNode: -1}`, []string{"spec.maxParallelOutboundPerNode", "greater than or equal to 0"}},
		{"auto-converge not a bool", `{allowAutoConverge: "maybe"}`, []string{"spec.allowAutoConverge", "boolean"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(context.Background(), object(t, "kind: MigrationPolicy\nmetadata: {name: "+ns+"-bad}\nspec: "+tt.spec))
			if err == nil {
				t.Fatalf("accepted; want an error mentioning %q", tt.want)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}

	good := object(t, `
kind: MigrationPolicy
metadata: {name: `+ns+`-freeze}
spec:
  selectors: {namespaceSelector: {team: a}}
  bandwidthPerMigration: 1Ki
  completionTimeoutPerGiB: 1
  progressTimeout: 86400
  allowAutoConverge: false
  maxParallelMigrations: 0
  maxParallelOutboundPerNode: 0`)
	if err := env.Client.Create(context.Background(), good); err != nil {
		t.Fatalf("the smallest allowed values refused: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), good) })
	out, err := exec.Command(filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", env.Kubeconfig, "get", "migrationpolicy", ns+"-freeze").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME BANDWIDTH COMPLETION-S-PER-GIB PROGRESS-S AUTO-CONVERGE MAX-PARALLEL MAX-PER-NODE AGE" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), ns+"-freeze 1Ki 1 86400 false 0 0 ") {
		t.Errorf("kubectl get migrationpolicy:\n%s\nwant its zeros and false shown", out)
	}
}
