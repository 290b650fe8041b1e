package kaironctl_test

// kaironctl claim and release against the real API server. No controller
// runs here: where a test needs a bind (or a release), it plays
// kairon-controller itself by writing the claim's status.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

const pendingMessage = `no Running warm machine in pool "agents" (2 warming)`

// claimPool creates the pool "agents" in ns.
func claimPool(t *testing.T, env *testenv.Env, ns string) {
	t.Helper()
	env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, "agents"), Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](2), Template: template(nil)}})
}

// listClaims returns the claims in ns.
func listClaims(t *testing.T, env *testenv.Env, ns string) []kaironv1.MachineClaim {
	t.Helper()
	var l kaironv1.MachineClaimList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// standIn runs on in the background, as a stand-in for kairon-controller,
// with every change to list's kind in ns (see watchEvents) until on reports
// done. The returned function waits for that and reports on's error, or
// that on was not done within a minute.
func standIn(t *testing.T, env *testenv.Env, list client.ObjectList, ns string, on func(ctx context.Context, ev watch.Event) (done bool, err error)) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	var (
		wg  sync.WaitGroup
		err error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		err = watchEvents(ctx, env, list, ns, func(ev watch.Event) (bool, error) { return on(ctx, ev) })
	}()
	return func() {
		t.Helper()
		wg.Wait()
		cancel()
		if err != nil {
			t.Errorf("fake controller: %v", err)
		}
	}
}

// fakeBinder stands in for kairon-controller: it waits for a claim to appear
// in ns, then calls act with it, once; act writes what the controller would.
// The returned function waits for the binder and reports its error.
func fakeBinder(t *testing.T, env *testenv.Env, ns string, act func(ctx context.Context, c *kaironv1.MachineClaim) error) func() {
	t.Helper()
	return standIn(t, env, &kaironv1.MachineClaimList{}, ns, func(ctx context.Context, ev watch.Event) (bool, error) {
		c, ok := ev.Object.(*kaironv1.MachineClaim)
		if !ok || ev.Type != watch.Added {
			return false, nil
		}
		return true, act(ctx, c)
	})
}

// writeClaimStatus sets a claim's status as kairon-controller would.
func writeClaimStatus(ctx context.Context, env *testenv.Env, c *kaironv1.MachineClaim, st kaironv1.MachineClaimStatus) error {
	fresh := &kaironv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), fresh); err != nil {
		return err
	}
	fresh.Status = st
	return env.Client.Status().Update(ctx, fresh)
}

// bindAfterPending first reports the claim Pending with the controller's
// message, then Bound to machine: two writes, which a watching kaironctl
// sees in that order.
func bindAfterPending(env *testenv.Env, machine string, millis int64) func(ctx context.Context, c *kaironv1.MachineClaim) error {
	return func(ctx context.Context, c *kaironv1.MachineClaim) error {
		if err := writeClaimStatus(ctx, env, c, kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimPending, Message: pendingMessage}); err != nil {
			return err
		}
		return writeClaimStatus(ctx, env, c, kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: machine, BindMillis: millis})
	}
}

func TestClaimWaitsForTheBind(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)

	done := fakeBinder(t, env, ns, bindAfterPending(env, "agents-8c21d0e4", 412))
	r := kctl(t, env, "claim", "agents", "--label", "team=ml", "--ttl", "1h", "-n", ns).ok(t, "claim")
	done()

	claims := listClaims(t, env, ns)
	if len(claims) != 1 {
		t.Fatalf("want one claim, found %d", len(claims))
	}
	c := claims[0]
	if !regexp.MustCompile(`^agents-claim-[0-9a-f]{6}$`).MatchString(c.Name) {
		t.Errorf("generated name %q is not agents-claim-<6 hex>", c.Name)
	}
	if want := "machineclaim/" + c.Name + " bound to machine/agents-8c21d0e4 in 412ms\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	want := kaironv1.MachineClaimSpec{
		PoolName:      "agents",
		Labels:        map[string]string{"team": "ml"},
		ReclaimPolicy: kaironv1.ReclaimDelete, // the API's default
		TTLSeconds:    ptr.To[int64](3600),
	}
	if !reflect.DeepEqual(c.Spec, want) {
		t.Errorf("spec %+v, want %+v", c.Spec, want)
	}
}

func TestClaimFlagsMapToSpec(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)

	r := kctl(t, env, "claim", "agents", "-n", ns, "--wait", "0", "--name", "job-43", "--retain", "--ttl", "90s",
		"--label", "team=ml", "--label", "example.com/owner=ada",
		"--allow-fqdn", "pypi.org", "--allow-fqdn", "files.pythonhosted.org", "--allow-fqdn", "pypi.org",
		"--allow-sni", "*.example.com", "--allow-cidr", "10.0.0.0/8", "--allow-cidr", "2001:db8::/32",
		"--allow-port", "443", "--allow-port", "8000-8100", "--allow-dns", "*.pypi.org", "--allow-icmp").ok(t, "claim")
	if r.stdout != "machineclaim/job-43 created\n" {
		t.Errorf("--wait 0 printed %q", r.stdout)
	}
	c := &kaironv1.MachineClaim{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "job-43"}, c); err != nil {
		t.Fatal(err)
	}
	want := kaironv1.MachineClaimSpec{
		PoolName:      "agents",
		Labels:        map[string]string{"team": "ml", "example.com/owner": "ada"},
		ReclaimPolicy: kaironv1.ReclaimRetain,
		TTLSeconds:    ptr.To[int64](90),
		Egress: &kaironv1.EgressRules{
			AllowFqdns: []kaironv1.Hostname{"pypi.org", "files.pythonhosted.org"},
			AllowSNI:   []kaironv1.ServerName{"*.example.com"},
			AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8", "2001:db8::/32"},
			AllowPorts: []kaironv1.PortRange{"443", "8000-8100"},
			AllowDNS:   []kaironv1.ServerName{"*.pypi.org"},
			AllowIcmp:  true,
		},
	}
	if !reflect.DeepEqual(c.Spec, want) {
		t.Errorf("spec\n%+v\nwant\n%+v", c.Spec, want)
	}
	// Stamped to the millisecond, within what creationTimestamp allows:
	// the controller measures bindMillis from it.
	if stamp, ok := rules.ClaimCreatedAt(c); !ok {
		t.Errorf("claim's %s = %q: not a creation stamp the controller believes (creationTimestamp %s)",
			kaironv1.AnnotationClaimCreatedAt, c.Annotations[kaironv1.AnnotationClaimCreatedAt], c.CreationTimestamp)
	} else if !strings.Contains(c.Annotations[kaironv1.AnnotationClaimCreatedAt], ".") || stamp.IsZero() {
		t.Errorf("claim's stamp %q has no milliseconds", c.Annotations[kaironv1.AnnotationClaimCreatedAt])
	}

	// Only --allow-icmp still makes an egress allowlist; no flag, none.
	kctl(t, env, "claim", "agents", "-n", ns, "--wait=0", "--name", "icmp-only", "--allow-icmp").ok(t)
	kctl(t, env, "claim", "agents", "-n", ns, "--wait=0", "--name", "open").ok(t)
	for name, egress := range map[string]*kaironv1.EgressRules{"icmp-only": {AllowIcmp: true}, "open": nil} {
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, c); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.Spec.Egress, egress) || c.Spec.TTLSeconds != nil || c.Spec.ReclaimPolicy != kaironv1.ReclaimDelete {
			t.Errorf("%s: spec %+v", name, c.Spec)
		}
	}

	// -o with --wait 0 prints the created claim.
	r = kctl(t, env, "claim", "agents", "-n", ns, "--wait=0", "--name", "as-yaml", "-o", "yaml").ok(t)
	var got kaironv1.MachineClaim
	if err := yaml.Unmarshal([]byte(r.stdout), &got); err != nil || got.Name != "as-yaml" || got.Kind != "MachineClaim" || got.Spec.PoolName != "agents" {
		t.Errorf("-o yaml: %v\n%s", err, r.stdout)
	}
}

func TestClaimTimeoutQuotesThePendingMessage(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)

	done := fakeBinder(t, env, ns, func(ctx context.Context, c *kaironv1.MachineClaim) error {
		return writeClaimStatus(ctx, env, c, kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimPending, Message: pendingMessage})
	})
	start := time.Now()
	r := kctl(t, env, "claim", "agents", "--name", "slow", "--wait", "2s", "-n", ns)
	took := time.Since(start)
	done()
	r.failed(t, "machineclaim/slow", "Pending", "2s", pendingMessage, "left in place", "kaironctl release slow -n "+ns)
	if r.stdout != "" {
		t.Errorf("printed %q on a timeout", r.stdout)
	}
	if took < 2*time.Second || took > 20*time.Second {
		t.Errorf("returned after %s with --wait 2s", took)
	}
	// The claim stays, to bind later or be released.
	if claims := listClaims(t, env, ns); len(claims) != 1 || claims[0].Name != "slow" {
		t.Errorf("claims after the timeout: %+v", claims)
	}

	// With no controller at all there is no status to quote; the error
	// says what is missing.
	r = kctl(t, env, "claim", "agents", "--name", "unseen", "--wait", "1s", "-n", ns)
	r.failed(t, "machineclaim/unseen", "no status yet", "kairon-controller", "kaironctl release unseen")
}

func TestClaimLostIsAnError(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)
	done := fakeBinder(t, env, ns, func(ctx context.Context, c *kaironv1.MachineClaim) error {
		return writeClaimStatus(ctx, env, c, kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimLost, MachineName: "agents-gone", Message: "machine agents-gone was deleted"})
	})
	r := kctl(t, env, "claim", "agents", "--name", "unlucky", "-n", ns)
	done()
	r.failed(t, "machineclaim/unlucky is Lost", "machine/agents-gone", "machine agents-gone was deleted", "kaironctl release unlucky")
}

func TestClaimPrintsTheBoundClaim(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			done := fakeBinder(t, env, ns, bindAfterPending(env, "agents-"+format, 7))
			r := kctl(t, env, "claim", "agents", "--name", "by-"+format, "-n", ns, "-o", format).ok(t)
			done()
			var got kaironv1.MachineClaim
			if err := yaml.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("-o %s: %v\n%s", format, err, r.stdout)
			}
			if format == "json" && !json.Valid([]byte(r.stdout)) {
				t.Errorf("-o json is not JSON:\n%s", r.stdout)
			}
			if got.Kind != "MachineClaim" || got.APIVersion != "kairon.zyvor.dev/v1alpha1" || got.Name != "by-"+format ||
				got.Status.Phase != kaironv1.ClaimBound || got.Status.MachineName != "agents-"+format || got.Status.BindMillis != 7 {
				t.Errorf("-o %s is not the bound claim:\n%s", format, r.stdout)
			}
			if strings.Contains(r.stdout, "managedFields") {
				t.Errorf("-o %s shows managedFields", format)
			}
			if err := env.Client.DeleteAllOf(context.Background(), &kaironv1.MachineClaim{}, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, "the claims to be deleted", func() (bool, string) {
				claims := listClaims(t, env, ns)
				return len(claims) == 0, fmt.Sprintf("%d claims", len(claims))
			})
		})
	}
}

// -o name prints what exec, cp, logs and release take; -o jsonpath one
// field, here the Machine to use.
func TestClaimPrintsNameAndJSONPath(t *testing.T) {
	env := testenv.Get(t)
	for _, tc := range []struct{ output, want string }{
		{"name", "machineclaim/c\n"},
		{"jsonpath={.status.phase} {.status.machineName}", "Bound agents-x"},
	} {
		// A namespace each: the stand-in binder binds the first claim it sees.
		ns := env.Namespace(t)
		claimPool(t, env, ns)
		done := fakeBinder(t, env, ns, bindAfterPending(env, "agents-x", 3))
		r := kctl(t, env, "claim", "agents", "--name", "c", "-n", ns, "-o", tc.output).ok(t)
		done()
		if r.stdout != tc.want {
			t.Errorf("-o %s printed %q, want %q", tc.output, r.stdout, tc.want)
		}
	}
	ns := env.Namespace(t)
	claimPool(t, env, ns)
	kctl(t, env, "claim", "agents", "-n", ns, "-o", "jsonpath={.status").failed(t, "-o/--output jsonpath template")
	kctl(t, env, "claim", "agents", "-n", ns, "-o", "jsonpath").failed(t, "needs a template")
	if claims := listClaims(t, env, ns); len(claims) != 0 {
		t.Errorf("%d claims after refused -o values, want none", len(claims))
	}
}

func TestClaimRefusesBadInput(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		// Flags kaironctl checks itself.
		{[]string{"--label", "team"}, []string{"--label", `"team"`, "KEY=VALUE"}},
		{[]string{"--label", "=ml"}, []string{"--label", "invalid key"}},
		{[]string{"--label", "team=m l"}, []string{"--label", "invalid value"}},
		{[]string{"--label", "kairon.zyvor.dev/pool-state=warm"}, []string{"--label", "reserved"}},
		{[]string{"--label", "team=ml", "--label", "team=ops"}, []string{"--label", "team", "twice"}},
		{[]string{"--ttl", "-1h"}, []string{"--ttl", "negative"}},
		{[]string{"--ttl", "1.5s"}, []string{"--ttl", "whole number of seconds"}},
		{[]string{"--ttl", "soon"}, []string{"--ttl", "soon"}},
		{[]string{"--wait", "-5s"}, []string{"--wait", "negative"}},
		{[]string{"--wait", "forever"}, []string{"--wait", "forever"}},
		{[]string{"--name", "Not_A_Name"}, []string{"--name", "Not_A_Name"}},
		{[]string{"--name", strings.Repeat("a", 64)}, []string{"--name", "63", kaironv1.LabelMachineClaim}},
		{[]string{"-o", "table"}, []string{"-o/--output", "json", "yaml", "name", "jsonpath=TEMPLATE"}},
		{[]string{"--frobnicate"}, []string{"--frobnicate"}},
		// Values only the API server checks: one line, naming the field and the flag.
		{[]string{"--allow-port", "443", "--allow-port", "70000"}, []string{"spec.egress.allowPorts[1] (--allow-port)", "1 <= N <= M <= 65535"}},
		{[]string{"--allow-cidr", "10.0.0.0/33"}, []string{"spec.egress.allowCidrs[0] (--allow-cidr)", "must be a CIDR"}},
		{[]string{"--allow-fqdn", "not a host"}, []string{"spec.egress.allowFqdns[0] (--allow-fqdn)", "DNS host name"}},
		{[]string{"--allow-sni", "*.*.x"}, []string{"spec.egress.allowSNI[0] (--allow-sni)"}},
	} {
		args := append([]string{"claim", "agents", "-n", ns}, tc.args...)
		r := kctl(t, env, args...)
		r.failed(t, tc.want...)
		if r.stdout != "" {
			t.Errorf("%v: printed %q", tc.args, r.stdout)
		}
	}
	// Arguments and the pool itself.
	kctl(t, env, "claim", "-n", ns).failed(t, "POOL")
	kctl(t, env, "claim", "agents", "extra", "-n", ns).failed(t, "POOL")
	kctl(t, env, "claim", "nope", "-n", ns).failed(t, `machinepool "nope" not found in namespace "`+ns+`"`)

	if claims := listClaims(t, env, ns); len(claims) != 0 {
		t.Errorf("refused claims were created: %+v", claims)
	}
}

// A claim name generated from a long pool name still fits in the label
// value that names the claim on its Machine.
func TestClaimNameFitsALabel(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	pool := strings.Repeat("p", 70)
	env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, pool), Spec: kaironv1.MachinePoolSpec{Template: template(nil)}})
	r := kctl(t, env, "claim", pool, "--wait=0", "-n", ns).ok(t)
	m := regexp.MustCompile(`^machineclaim/(p+-claim-[0-9a-f]{6}) created\n$`).FindStringSubmatch(r.stdout)
	if m == nil || len(m[1]) > 63 {
		t.Fatalf("stdout %q", r.stdout)
	}
}

// claimHolding creates a Bound claim on machine, as kairon-controller leaves
// one: the Machine labelled as claimed, and the claim held by a finalizer
// so that it stays until its Machine is dealt with.
func claimHolding(t *testing.T, env *testenv.Env, ns, name, machine string, policy kaironv1.ReclaimPolicy) {
	t.Helper()
	m := plainMachine(ns, machine)
	m.Labels = map[string]string{
		kaironv1.LabelMachinePool: "agents", kaironv1.LabelMachinePoolTemplateHash: "abc123",
		kaironv1.LabelPoolState: kaironv1.PoolStateClaimed, kaironv1.LabelMachineClaim: name, "team": "ml",
	}
	env.Create(t, m)
	c := &kaironv1.MachineClaim{ObjectMeta: meta(ns, name), Spec: kaironv1.MachineClaimSpec{PoolName: "agents", ReclaimPolicy: policy}}
	c.Finalizers = []string{"test.kairon.zyvor.dev/release"}
	env.Create(t, c)
	c.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: machine, BindMillis: 5}
	env.SetStatus(t, c)
}

// fakeReleaser plays kairon-controller for a claim being deleted: once the
// claim has a deletionTimestamp it deletes the Machine (Delete) or strips
// its pool labels (Retain), then lets the claim go.
func fakeReleaser(t *testing.T, env *testenv.Env, ns, name, machine string) func() {
	t.Helper()
	return standIn(t, env, &kaironv1.MachineClaimList{}, ns, func(ctx context.Context, ev watch.Event) (bool, error) {
		c, ok := ev.Object.(*kaironv1.MachineClaim)
		if !ok || c.Name != name || c.DeletionTimestamp == nil {
			return false, nil
		}
		m := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: machine}, m); err != nil {
			return true, err
		}
		if c.Spec.ReclaimPolicy == kaironv1.ReclaimRetain {
			for _, l := range []string{kaironv1.LabelMachinePool, kaironv1.LabelMachinePoolTemplateHash, kaironv1.LabelPoolState, kaironv1.LabelMachineClaim} {
				delete(m.Labels, l)
			}
			if err := env.Client.Update(ctx, m); err != nil {
				return true, err
			}
		} else if err := env.Client.Delete(ctx, m); err != nil {
			return true, err
		}
		c.Finalizers = nil
		return true, env.Client.Update(ctx, c)
	})
}

func TestRelease(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	exists := func(obj client.Object, name string) bool {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}

	t.Run("Delete", func(t *testing.T) {
		claimHolding(t, env, ns, "job-1", "agents-11111111", kaironv1.ReclaimDelete)
		done := fakeReleaser(t, env, ns, "job-1", "agents-11111111")
		r := kctl(t, env, "release", "job-1", "-n", ns).ok(t, "release")
		done()
		if want := "machineclaim/job-1 released\nmachine/agents-11111111 deleted\n"; r.stdout != want {
			t.Errorf("stdout %q, want %q", r.stdout, want)
		}
		if exists(&kaironv1.MachineClaim{}, "job-1") || exists(&kaironv1.Machine{}, "agents-11111111") {
			t.Error("claim or machine still there")
		}
	})

	t.Run("Retain", func(t *testing.T) {
		claimHolding(t, env, ns, "job-2", "agents-22222222", kaironv1.ReclaimRetain)
		done := fakeReleaser(t, env, ns, "job-2", "agents-22222222")
		// As kaironctl claim -o name prints it.
		r := kctl(t, env, "release", "machineclaim/job-2", "-n", ns).ok(t, "release")
		done()
		if want := "machineclaim/job-2 released\nmachine/agents-22222222 kept (reclaimPolicy Retain)\n"; r.stdout != want {
			t.Errorf("stdout %q, want %q", r.stdout, want)
		}
		m := &kaironv1.Machine{}
		if exists(&kaironv1.MachineClaim{}, "job-2") || !exists(m, "agents-22222222") {
			t.Fatal("want the claim gone and the machine kept")
		}
		if !reflect.DeepEqual(m.Labels, map[string]string{"team": "ml"}) {
			t.Errorf("kept machine's labels %v", m.Labels)
		}
	})

	t.Run("no wait", func(t *testing.T) {
		claimHolding(t, env, ns, "job-3", "agents-33333333", kaironv1.ReclaimDelete)
		r := kctl(t, env, "release", "job-3", "-n", ns, "--wait=false").ok(t)
		if want := "machineclaim/job-3 released\nmachine/agents-33333333 will be deleted (reclaimPolicy Delete)\n"; r.stdout != want {
			t.Errorf("stdout %q, want %q", r.stdout, want)
		}
		c := &kaironv1.MachineClaim{}
		if !exists(c, "job-3") || c.DeletionTimestamp == nil {
			t.Error("want the claim still there, being deleted")
		}
		c.Finalizers = nil
		if err := env.Client.Update(ctx, c); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("timeout names what holds the claim", func(t *testing.T) {
		claimHolding(t, env, ns, "job-4", "agents-44444444", kaironv1.ReclaimDelete)
		r := kctl(t, env, "release", "job-4", "-n", ns, "--timeout", "1s")
		r.failed(t, "machineclaim/job-4", "test.kairon.zyvor.dev/release", "--timeout")
		c := &kaironv1.MachineClaim{}
		if exists(c, "job-4") {
			c.Finalizers = nil
			_ = env.Client.Update(ctx, c)
		}
	})

	t.Run("pending claim", func(t *testing.T) {
		env.Create(t, &kaironv1.MachineClaim{ObjectMeta: meta(ns, "waiting"), Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}})
		r := kctl(t, env, "release", "waiting", "-n", ns).ok(t)
		if r.stdout != "machineclaim/waiting released\n" {
			t.Errorf("stdout %q", r.stdout)
		}
	})

	t.Run("errors", func(t *testing.T) {
		kctl(t, env, "release", "ghost", "-n", ns).failed(t, `machineclaim "ghost" not found in namespace "`+ns+`"`)
		kctl(t, env, "release", "-n", ns).failed(t, "CLAIM")
		kctl(t, env, "release", "a", "b", "-n", ns).failed(t, "CLAIM")
		kctl(t, env, "release", "a", "--timeout", "-1s", "-n", ns).failed(t, "--timeout")
	})
}

// claim and release appear in help with the other verbs.
func TestClaimAndReleaseAreVerbs(t *testing.T) {
	r := kctlContext(context.Background(), "", &bytes.Buffer{}, "--help").ok(t)
	for _, verb := range []string{"claim", "release"} {
		if !regexp.MustCompile(`(?m)^  ` + verb + ` `).MatchString(r.stdout) {
			t.Errorf("help does not list %s:\n%s", verb, r.stdout)
		}
	}
}

// claim --help gives --wait's default as the guides write it.
func TestClaimHelpShowsTheWaitDefault(t *testing.T) {
	r := kctlContext(context.Background(), "", &bytes.Buffer{}, "claim", "--help").ok(t)
	if !regexp.MustCompile(`--wait duration +How long to wait for the bind; 0 creates the claim and returns \(default 60s\)`).MatchString(r.stdout) {
		t.Errorf("claim --help does not give --wait's default as 60s:\n%s", r.stdout)
	}
}
