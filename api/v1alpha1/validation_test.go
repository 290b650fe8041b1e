package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/zyvor/kairon/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// object parses one YAML document into an unstructured object, so the tests
// send exactly what a user's manifest would, including wrong types.
func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatalf("bad test YAML: %v\n%s", err, doc)
	}
	if u.GetAPIVersion() == "" {
		u.SetAPIVersion("kairon.zyvor.dev/v1alpha1")
	}
	return u
}

func TestEveryExampleIsAccepted(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	kinds := map[string]bool{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			u := object(t, doc)
			if u.GetKind() != "MigrationPolicy" { // cluster-scoped
				u.SetNamespace(ns)
			}
			if err := env.Client.Create(context.Background(), u); err != nil {
				t.Errorf("%s: %s %q refused: %v", file, u.GetKind(), u.GetName(), err)
			}
			kinds[u.GetKind()] = true
		}
	}
	for _, kind := range []string{"Machine", "MachineSet", "MachinePool", "MachineClaim",
		"MachineDisruptionBudget", "MachineMigration", "MachineNetworkPolicy", "MachineQuota", "MigrationPolicy", "MachineSnapshot", "SnapshotSchedule"} {
		if !kinds[kind] {
			t.Errorf("examples/ has no %s", kind)
		}
	}
}

func TestAPIServerRefusesInvalidObjects(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)

	tests := []struct {
		name string
		doc  string
		// want are substrings the API server's error must contain: the field
		// path and what is wrong with it.
		want []string
	}{
		{"budget with both bounds", `
kind: MachineDisruptionBudget
metadata: {name: both}
spec: {selector: {tier: web}, minAvailable: 2, maxUnavailable: 1}`,
			[]string{"spec", "exactly one of spec.minAvailable or spec.maxUnavailable"}},
		{"budget with neither bound", `
kind: MachineDisruptionBudget
metadata: {name: neither}
spec: {selector: {tier: web}}`,
			[]string{"spec", "exactly one of spec.minAvailable or spec.maxUnavailable"}},
		{"budget with a malformed count", `
kind: MachineDisruptionBudget
metadata: {name: words}
spec: {minAvailable: "two"}`,
			[]string{"spec.minAvailable", "non-negative integer or a percentage"}},
		{"budget over 100 percent", `
kind: MachineDisruptionBudget
metadata: {name: toomuch}
spec: {maxUnavailable: "150%"}`,
			[]string{"spec.maxUnavailable", "percentage from 0% to 100%"}},
		{"budget with a negative integer", `
kind: MachineDisruptionBudget
metadata: {name: negative}
spec: {minAvailable: -1}`,
			[]string{"spec.minAvailable", "non-negative integer"}},
		{"image without a registry", `
kind: Machine
metadata: {name: no-registry}
spec: {image: "kairon/python:3.11"}`,
			[]string{"spec.image", "full OCI image reference registry[:port]/repository[:tag]"}},
		{"image with a short digest", `
kind: Machine
metadata: {name: short-digest}
spec: {image: "127.0.0.1:5000/kairon/python@sha256:abc"}`,
			[]string{"spec.image", "@sha256:<64 lowercase hex digits>"}},
		{"image with an uppercase repository", `
kind: Machine
metadata: {name: upper}
spec: {image: "ghcr.io/Team/app"}`,
			[]string{"spec.image", "built-in guest image name"}},
		{"pool template with a bad image", `
kind: MachinePool
metadata: {name: bad-image}
spec: {template: {spec: {image: "ghcr.io/team/app:"}}}`,
			[]string{"spec.template.spec.image", "OCI image reference"}},
		{"port zero", `
kind: MachineClaim
metadata: {name: port-zero}
spec: {poolName: agents, egress: {allowPorts: ["0"]}}`,
			[]string{"spec.egress.allowPorts[0]", "1 <= N <= M <= 65535"}},
		{"port above 65535", `
kind: MachineClaim
metadata: {name: port-big}
spec: {poolName: agents, egress: {allowPorts: ["443", "70000"]}}`,
			[]string{"spec.egress.allowPorts[1]", "1 <= N <= M <= 65535"}},
		{"reversed port range", `
kind: MachineClaim
metadata: {name: port-reversed}
spec: {poolName: agents, egress: {allowPorts: ["8100-8000"]}}`,
			[]string{"spec.egress.allowPorts[0]", "N-M"}},
		{"port name instead of number", `
kind: MachineNetworkPolicy
metadata: {name: port-name}
spec: {machineName: m, egress: {allowPorts: ["https"]}}`,
			[]string{"spec.egress.allowPorts[0]", "must be a port"}},
		{"CIDR with a bad prefix", `
kind: MachineClaim
metadata: {name: cidr-prefix}
spec: {poolName: agents, egress: {allowCidrs: ["10.0.0.0/33"]}}`,
			[]string{"spec.egress.allowCidrs[0]", "must be a CIDR"}},
		{"CIDR that is a host name", `
kind: MachineNetworkPolicy
metadata: {name: cidr-name}
spec: {machineName: m, egress: {allowCidrs: ["example.com"]}}`,
			[]string{"spec.egress.allowCidrs[0]", "must be a CIDR"}},
		{"SNI wildcard in the middle", `
kind: MachineClaim
metadata: {name: sni-middle}
spec: {poolName: agents, egress: {allowSNI: ["api.*.example.com"]}}`,
			[]string{"spec.egress.allowSNI[0]", "wildcard suffix"}},
		{"SNI wildcard without a dot", `
kind: MachineClaim
metadata: {name: sni-nodot}
spec: {poolName: agents, egress: {allowSNI: ["*example.com"]}}`,
			[]string{"spec.egress.allowSNI[0]", "wildcard suffix"}},
		{"FQDN with a wildcard inside", `
kind: MachineClaim
metadata: {name: fqdn-wild}
spec: {poolName: agents, egress: {allowFqdns: ["files.*.pypi.org"]}}`,
			[]string{"spec.egress.allowFqdns[0]", "DNS host name"}},
		{"FQDN wildcard without its dot", `
kind: MachineClaim
metadata: {name: fqdn-wild-nodot}
spec: {poolName: agents, egress: {allowFqdns: ["*pypi.org"]}}`,
			[]string{"spec.egress.allowFqdns[0]", "wildcard suffix"}},
		{"unknown reclaim policy", `
kind: MachineClaim
metadata: {name: reclaim}
spec: {poolName: agents, reclaimPolicy: Keep}`,
			[]string{"spec.reclaimPolicy", "Unsupported value", "Delete", "Retain"}},
		{"claim without a pool", `
kind: MachineClaim
metadata: {name: nopool}
spec: {labels: {a: b}}`,
			[]string{"spec.poolName", "Required value"}},
		{"claim with a zero TTL", `
kind: MachineClaim
metadata: {name: ttl}
spec: {poolName: agents, ttlSeconds: 0}`,
			[]string{"spec.ttlSeconds", "greater than or equal to 1"}},
		{"pool with negative replicas", `
kind: MachinePool
metadata: {name: negative}
spec: {replicas: -1}`,
			[]string{"spec.replicas", "greater than or equal to 0"}},
		{"set with negative replicas", `
kind: MachineSet
metadata: {name: negative}
spec: {replicas: -1, selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}}}`,
			[]string{"spec.replicas", "greater than or equal to 0"}},
		{"set whose selector misses its template", `
kind: MachineSet
metadata: {name: mismatch}
spec: {selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: db}}}}`,
			[]string{"spec", "spec.selector.matchLabels must match spec.template.metadata.labels"}},
		{"machine with no vCPU", `
kind: Machine
metadata: {name: nocpu}
spec: {cpu: 0}`,
			[]string{"spec.cpu", "greater than or equal to 1"}},
		{"machine with too little memory", `
kind: Machine
metadata: {name: tiny}
spec: {memory: 32Mi}`,
			[]string{"spec.memory", "at least 64Mi"}},
		{"machine with an unknown power state", `
kind: Machine
metadata: {name: power}
spec: {powerState: Paused}`,
			[]string{"spec.powerState", "Unsupported value"}},
		{"migration with an unknown strategy", `
kind: MachineMigration
metadata: {name: warm}
spec: {machineName: m, strategy: warm}`,
			[]string{"spec.strategy", "Unsupported value", "cold", "live"}},
		{"policy that selects nothing", `
kind: MachineNetworkPolicy
metadata: {name: none}
spec: {egress: {allowIcmp: true}}`,
			[]string{"spec", "exactly one of spec.machineName or spec.machineSelector"}},
		{"set over the replica maximum", `
kind: MachineSet
metadata: {name: huge}
spec: {replicas: 1001, selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}}}`,
			[]string{"spec.replicas", "less than or equal to 1000"}},
		{"pool over the replica maximum", `
kind: MachinePool
metadata: {name: huge}
spec: {replicas: 2147483647}`,
			[]string{"spec.replicas", "less than or equal to 1000"}},
		{"machine with a huge nodeSelector", `
kind: Machine
metadata: {name: huge-selector}
spec: {nodeSelector: ` + hugeMap(65) + `}`,
			[]string{"spec.nodeSelector", "must have at most 64 items"}},
		{"claim with huge labels", `
kind: MachineClaim
metadata: {name: huge-labels}
spec: {poolName: agents, labels: ` + hugeMap(65) + `}`,
			[]string{"spec.labels", "must have at most 64 items"}},
		{"budget with a huge selector", `
kind: MachineDisruptionBudget
metadata: {name: huge-selector}
spec: {maxUnavailable: 1, selector: ` + hugeMap(65) + `}`,
			[]string{"spec.selector", "must have at most 64 items"}},
		{"set template with huge labels", `
kind: MachineSet
metadata: {name: huge-template}
spec: {template: {metadata: {labels: ` + hugeMap(65) + `}}}`,
			[]string{"spec.template.metadata.labels", "must have at most 64 items"}},
		{"machine with a huge kernel argument", `
kind: Machine
metadata: {name: huge-arg}
spec: {kernelArgs: ["` + strings.Repeat("a", 1025) + `"]}`,
			[]string{"spec.kernelArgs[0]", "may not be more than 1024"}},
		{"claim whose name cannot be a label value", `
kind: MachineClaim
metadata: {name: ` + strings.Repeat("c", 64) + `}
spec: {poolName: agents}`,
			[]string{"metadata.name", "at most 63 characters"}},
		{"set whose name cannot be a label value", `
kind: MachineSet
metadata: {name: ` + strings.Repeat("s", 64) + `}
spec: {replicas: 0, selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}}}`,
			[]string{"metadata.name", "at most 63 characters"}},
		{"quota with a negative limit", `
kind: MachineQuota
metadata: {name: negative}
spec: {hard: {machines: -1}}`,
			[]string{"spec.hard.machines", "greater than or equal to 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := object(t, tt.doc)
			u.SetNamespace(ns)
			err := env.Client.Create(context.Background(), u)
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
}

// hugeMap is a YAML flow map with n distinct keys.
func hugeMap(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("k%d: v", i)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func TestAPIServerAcceptsWellFormedEdgeCases(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, doc := range []string{`
kind: MachineClaim
metadata: {name: edges}
spec:
  poolName: agents
  egress:
    allowPorts: ["1", "65535", "8000-8100", "443-443"]
    allowCidrs: ["0.0.0.0/0", "2001:db8::/32", "192.0.2.7/32"]
    allowSNI: ["*.example.com", "api.example.com"]
    allowDNS: ["*.pythonhosted.org"]
    allowFqdns: ["pypi.org", "localhost", "*.pythonhosted.org"]`, `
kind: Machine
metadata: {name: oci-image}
spec:
  image: "127.0.0.1:5000/kairon/python:3.11@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  imagePullSecrets: [{name: registry-credentials}]`, `
kind: Machine
metadata: {name: localhost-image}
spec: {image: "localhost:5000/app"}`, `
kind: MachineDisruptionBudget
metadata: {name: percent}
spec: {maxUnavailable: "100%"}`, `
kind: MachineDisruptionBudget
metadata: {name: zero}
spec: {minAvailable: 0}`, `
kind: MachineDisruptionBudget
metadata: {name: string-int}
spec: {minAvailable: "3", selector: {}}`} {
		u := object(t, doc)
		u.SetNamespace(ns)
		if err := env.Client.Create(context.Background(), u); err != nil {
			t.Errorf("%s %q refused: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

func TestImmutableFields(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	tests := []struct {
		doc   string
		field []string
		value string
		want  string
	}{
		{"kind: MachineClaim\nmetadata: {name: moving}\nspec: {poolName: agents}",
			[]string{"spec", "poolName"}, "other", "spec.poolName is immutable"},
		{"kind: MachineMigration\nmetadata: {name: retarget}\nspec: {machineName: a}",
			[]string{"spec", "machineName"}, "b", "spec is immutable"},
	}
	for _, tt := range tests {
		u := object(t, tt.doc)
		u.SetNamespace(ns)
		if err := env.Client.Create(ctx, u); err != nil {
			t.Fatalf("create %s: %v", u.GetKind(), err)
		}
		if err := unstructured.SetNestedField(u.Object, tt.value, tt.field...); err != nil {
			t.Fatal(err)
		}
		err := env.Client.Update(ctx, u)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: update of %s: got %v, want an error containing %q", u.GetKind(), strings.Join(tt.field, "."), err, tt.want)
		}
	}
}

func TestDefaults(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	machine := object(t, "kind: Machine\nmetadata: {name: empty}\nspec: {}")
	machine.SetNamespace(ns)
	if err := env.Client.Create(ctx, machine); err != nil {
		t.Fatal(err)
	}
	claim := object(t, "kind: MachineClaim\nmetadata: {name: plain}\nspec: {poolName: agents}")
	claim.SetNamespace(ns)
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		obj   *unstructured.Unstructured
		field []string
		want  any
	}{
		{machine, []string{"spec", "cpu"}, int64(1)},
		{machine, []string{"spec", "memory"}, "256Mi"},
		{machine, []string{"spec", "image"}, "default"},
		{machine, []string{"spec", "powerState"}, "Running"},
		{claim, []string{"spec", "reclaimPolicy"}, "Delete"},
	} {
		got, _, _ := unstructured.NestedFieldNoCopy(tt.obj.Object, tt.field...)
		if got != tt.want {
			t.Errorf("%s %s = %#v, want %#v", tt.obj.GetKind(), strings.Join(tt.field, "."), got, tt.want)
		}
	}
}

// A tenant whose Machine was charged at creation tries to grow it afterwards,
// every way a merge or replace can spell it. Each must be refused with the
// field named; the same edits of a template stay allowed.
func TestMachineSizeIsImmutable(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	tests := []struct {
		name   string
		create string
		edit   func(u *unstructured.Unstructured)
		want   []string
	}{
		{"cpu raised", "spec: {cpu: 1}", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(64), "spec", "cpu")
		}, []string{"spec.cpu", "spec.cpu is immutable"}},
		{"defaulted cpu raised", "spec: {}", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(2), "spec", "cpu")
		}, []string{"spec.cpu", "spec.cpu is immutable"}},
		{"cpu lowered", "spec: {cpu: 4}", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(1), "spec", "cpu")
		}, []string{"spec.cpu", "spec.cpu is immutable"}},
		{"memory raised", "spec: {memory: 256Mi}", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "64Gi", "spec", "memory")
		}, []string{"spec.memory", "spec.memory is immutable"}},
		{"memory raised as a plain number", "spec: {memory: 256Mi}", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(1)<<36, "spec", "memory")
		}, []string{"spec.memory", "spec.memory is immutable"}},
		// Created without any spec, so a rule on spec.cpu itself would have
		// no old value to compare with.
		{"spec added to a Machine created without one", "", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, map[string]any{"cpu": int64(64), "memory": "64Gi"}, "spec")
		}, []string{"spec.cpu is immutable", "spec.memory is immutable"}},
		{"cpu removed", "spec: {cpu: 8}", func(u *unstructured.Unstructured) {
			unstructured.RemoveNestedField(u.Object, "spec", "cpu")
		}, []string{"spec.cpu", "spec.cpu is immutable"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := fmt.Sprintf("kind: Machine\nmetadata: {name: grow-%d}\n%s", i, tt.create)
			u := object(t, doc)
			u.SetNamespace(ns)
			if err := env.Client.Create(ctx, u); err != nil {
				t.Fatalf("create: %v", err)
			}
			tt.edit(u)
			err := env.Client.Update(ctx, u)
			if err == nil {
				t.Fatalf("update accepted; want an error mentioning %q", tt.want)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}

	t.Run("same size spelled differently and other fields", func(t *testing.T) {
		u := object(t, "kind: Machine\nmetadata: {name: respell}\nspec: {memory: 1Gi}")
		u.SetNamespace(ns)
		if err := env.Client.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(u.Object, "1024Mi", "spec", "memory")
		_ = unstructured.SetNestedField(u.Object, "Stopped", "spec", "powerState")
		u.SetLabels(map[string]string{"a": "b"})
		if err := env.Client.Update(ctx, u); err != nil {
			t.Errorf("update that keeps the size refused: %v", err)
		}
	})

	t.Run("templates stay editable", func(t *testing.T) {
		u := object(t, "kind: MachinePool\nmetadata: {name: resize}\nspec: {replicas: 0, template: {spec: {cpu: 1}}}")
		u.SetNamespace(ns)
		if err := env.Client.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(u.Object, int64(4), "spec", "template", "spec", "cpu")
		_ = unstructured.SetNestedField(u.Object, "1Gi", "spec", "template", "spec", "memory")
		if err := env.Client.Update(ctx, u); err != nil {
			t.Errorf("pool template resize refused: %v", err)
		}
	})
}
