package kaironctl_test

// kaironctl mcp serve's tools, called by an MCP client connected in-process
// to the server, against the real API server. As in claim_test.go, the test
// plays kairon-controller where a tool waits for it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/kaironctl"
	"github.com/zyvor/kairon/internal/testenv"
)

// mcpSession connects a client to NewMCPServer for namespace ns.

var (
	readOnly = kaironctl.MCPOptions{}
	writable = kaironctl.MCPOptions{AllowWrite: true, Session: "test-session"}
)

func mcpSession(t *testing.T, env *testenv.Env, ns string, opts kaironctl.MCPOptions) *mcp.ClientSession {
	t.Helper()
	return mcpSessionWith(t, env, ns, opts, func(*genericclioptions.ConfigFlags) {})
}

// mcpSessionWith is mcpSession with flags set by set (--as, say).
func mcpSessionWith(t *testing.T, env *testenv.Env, ns string, opts kaironctl.MCPOptions, set func(*genericclioptions.ConfigFlags)) *mcp.ClientSession {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(true)
	*flags.KubeConfig = env.Kubeconfig
	*flags.Namespace = ns
	set(flags)
	var out bytes.Buffer
	o := &kaironctl.Options{ConfigFlags: flags, Out: &out, ErrOut: &out, Now: time.Now}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := kaironctl.NewMCPServer(o, opts).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
		if out.Len() > 0 {
			t.Errorf("the tools printed to Out: %q", out.String())
		}
	})
	return cs
}

// callTool calls a tool and decodes its structured output into out. It
// returns the text of a tool error ("" on success).
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	if res.IsError {
		var msgs []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				msgs = append(msgs, tc.Text)
			}
		}
		return strings.Join(msgs, "\n")
	}
	if out != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: output %s: %v", name, b, err)
		}
	}
	return ""
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func TestMCPToolsNeedAllowWrite(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	if got := toolNames(t, mcpSession(t, env, ns, readOnly)); !slices.Equal(got, []string{"list_machine_pools"}) {
		t.Errorf("read-only tools: %v", got)
	}
	want := []string{"claim_machine", "delete_machine", "exec_in_machine", "list_machine_pools", "read_file", "release_claim", "write_file"}
	if got := toolNames(t, mcpSession(t, env, ns, writable)); !slices.Equal(got, want) {
		t.Errorf("--allow-write tools: %v, want %v", got, want)
	}
	// A write tool is not there to call without --allow-write.
	res, err := mcpSession(t, env, ns, readOnly).CallTool(context.Background(), &mcp.CallToolParams{Name: "claim_machine", Arguments: map[string]any{"pool": "agents"}})
	if err == nil && !res.IsError {
		t.Error("claim_machine ran on a read-only server")
	}
	if claims := listClaims(t, env, ns); len(claims) != 0 {
		t.Errorf("claims created: %+v", claims)
	}
}

func TestMCPListMachinePools(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	p := &kaironv1.MachinePool{ObjectMeta: meta(ns, "agents"), Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](3), Template: template(nil)}}
	env.Create(t, p)
	p.Status = kaironv1.MachinePoolStatus{Replicas: 3, Warm: 3, ReadyWarm: 2, Claimed: 1}
	env.SetStatus(t, p)

	var out kaironctl.ListMachinePoolsOutput
	if msg := callTool(t, mcpSession(t, env, ns, readOnly), "list_machine_pools", map[string]any{}, &out); msg != "" {
		t.Fatalf("tool error: %s", msg)
	}
	want := []kaironctl.MachinePoolSummary{{Namespace: ns, Name: "agents", Desired: 3, Warm: 3, ReadyWarm: 2, Claimed: 1}}
	if !slices.Equal(out.Pools, want) {
		t.Errorf("pools %+v, want %+v", out.Pools, want)
	}

	// all_namespaces finds it from a session configured for another namespace.
	out = kaironctl.ListMachinePoolsOutput{}
	if msg := callTool(t, mcpSession(t, env, env.Namespace(t), readOnly), "list_machine_pools", map[string]any{"all_namespaces": true}, &out); msg != "" {
		t.Fatalf("tool error: %s", msg)
	}
	if !slices.Contains(out.Pools, want[0]) {
		t.Errorf("all_namespaces: %+v lacks %+v", out.Pools, want[0])
	}
}

func TestMCPClaimReleaseDelete(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	claimPool(t, env, ns)
	cs := mcpSession(t, env, ns, writable)

	// The Machine the fake controller binds, with an address.
	m := plainMachine(ns, "agents-8c21d0e4")
	env.Create(t, m)
	m.Status.Phase = kaironv1.MachineRunning
	m.Status.Addresses = []kaironv1.MachineAddress{{Type: "InternalIP", Address: "10.88.0.7"}}
	env.SetStatus(t, m)

	done := fakeBinder(t, env, ns, bindAfterPending(env, "agents-8c21d0e4", 412))
	var claimed kaironctl.ClaimMachineOutput
	msg := callTool(t, cs, "claim_machine", map[string]any{
		"pool": "agents", "labels": map[string]string{"team": "ml"}, "ttl": "1h", "wait": "30s",
		"allow_fqdns": []string{"pypi.org"}, "allow_ports": []string{"443"},
	}, &claimed)
	done()
	if msg != "" {
		t.Fatalf("claim_machine: %s", msg)
	}
	if !strings.HasPrefix(claimed.Claim, "agents-claim-") || claimed.Machine != "agents-8c21d0e4" || claimed.BindMillis != 412 ||
		claimed.Address != "10.88.0.7" || claimed.Phase != string(kaironv1.ClaimBound) {
		t.Errorf("claim_machine returned %+v", claimed)
	}
	c := &kaironv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: claimed.Claim}, c); err != nil {
		t.Fatal(err)
	}
	if c.Spec.Labels["team"] != "ml" || ptr.Deref(c.Spec.TTLSeconds, 0) != 3600 || c.Spec.Egress == nil ||
		!slices.Equal(c.Spec.Egress.AllowFqdns, []kaironv1.Hostname{"pypi.org"}) || !slices.Equal(c.Spec.Egress.AllowPorts, []kaironv1.PortRange{"443"}) {
		t.Errorf("claim spec %+v", c.Spec)
	}

	// release_claim: the fake controller deletes the Machine and lets the
	// claim go.
	c.Finalizers = []string{"test.kairon.zyvor.dev/release"}
	if err := env.Client.Update(ctx, c); err != nil {
		t.Fatal(err)
	}
	done = fakeReleaser(t, env, ns, claimed.Claim, "agents-8c21d0e4")
	var released kaironctl.ReleaseClaimOutput
	msg = callTool(t, cs, "release_claim", map[string]any{"claim": claimed.Claim}, &released)
	done()
	if msg != "" {
		t.Fatalf("release_claim: %s", msg)
	}
	if released.Claim != claimed.Claim || released.Machine != "agents-8c21d0e4" || released.MachineResult != "deleted" {
		t.Errorf("release_claim returned %+v", released)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), c); !apierrors.IsNotFound(err) {
		t.Errorf("claim after release_claim: %v", err)
	}

	if c.Labels[kaironctl.LabelMCPSession] != "test-session" || c.Spec.Labels[kaironctl.LabelMCPSession] != "test-session" {
		t.Errorf("the claim and its Machine's labels do not name the session: %v, %v", c.Labels, c.Spec.Labels)
	}

	// delete_machine deletes a Machine of the session (a claimed one kept
	// by Retain carries the label), and nothing else.
	scratch := plainMachine(ns, "scratch")
	scratch.Labels = map[string]string{kaironctl.LabelMCPSession: "test-session"}
	env.Create(t, scratch)
	env.Create(t, plainMachine(ns, "someone-elses"))
	if msg := callTool(t, cs, "delete_machine", map[string]any{"machine": "someone-elses"}, nil); !strings.Contains(msg, "machine/someone-elses was not created by this MCP session") {
		t.Errorf("delete_machine of another's Machine: %q", msg)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "someone-elses"}, &kaironv1.Machine{}); err != nil {
		t.Errorf("the refused Machine: %v", err)
	}
	var deleted kaironctl.DeleteMachineOutput
	if msg := callTool(t, cs, "delete_machine", map[string]any{"machine": "scratch"}, &deleted); msg != "" {
		t.Fatalf("delete_machine: %s", msg)
	}
	if !deleted.Deleted || deleted.Machine != "scratch" || deleted.Summary != "machine/scratch deleted" {
		t.Errorf("delete_machine returned %+v", deleted)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "scratch"}, &kaironv1.Machine{}); !apierrors.IsNotFound(err) {
		t.Errorf("machine after delete_machine: %v", err)
	}
}

func TestMCPToolErrors(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	claimPool(t, env, ns)
	cs := mcpSession(t, env, ns, writable)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		// The CLI's own one-line messages.
		{"claim_machine", map[string]any{"pool": "nope"}, `machinepool "nope" not found in namespace "` + ns + `"`},
		{"claim_machine", map[string]any{"pool": "agents", "labels": map[string]string{"team": "m l"}}, `--label "team=m l": invalid value`},
		{"claim_machine", map[string]any{"pool": "agents", "ttl": "soon"}, `invalid ttl "soon"`},
		{"claim_machine", map[string]any{"pool": "agents", "allow_ports": []string{"70000"}}, "spec.egress.allowPorts[0] (--allow-port)"},
		{"release_claim", map[string]any{"claim": "ghost"}, `machineclaim "ghost" not found in namespace "` + ns + `"`},
		{"delete_machine", map[string]any{"machine": "ghost"}, `machine "ghost" not found in namespace "` + ns + `"`},
	} {
		msg := callTool(t, cs, tc.tool, tc.args, nil)
		if !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
			t.Errorf("%s %v: tool error %q, want one line with %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	if claims := listClaims(t, env, ns); len(claims) != 0 {
		t.Errorf("refused claims were created: %+v", claims)
	}
}

// mcp serve is a verb, and --allow-write is its switch.
func TestMCPServeHelp(t *testing.T) {
	r := kctlContext(context.Background(), "", &bytes.Buffer{}, "mcp", "serve", "--help").ok(t)
	for _, want := range []string{"--allow-write", "list_machine_pools", "claim_machine", "release_claim", "delete_machine", "exec_in_machine", "write_file", "read_file", "--max-claims", "--egress-ceiling"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestMCPLimits: what the operator set bounds what the agent may do: the
// session's own claims only, how many, how long, no retain, and an egress
// ceiling that a claim without egress gets and one reaching past it fails.
func TestMCPLimits(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	claimPool(t, env, ns)
	ceiling := kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org", "*.pythonhosted.org"}, AllowPorts: []kaironv1.PortRange{"443"}}
	limited := kaironctl.MCPOptions{AllowWrite: true, Session: "s1", MaxClaims: 1, DefaultTTL: 30 * time.Minute, MaxTTL: 2 * time.Hour, NoRetain: true, Ceiling: &ceiling}
	cs := mcpSession(t, env, ns, limited)

	var first kaironctl.ClaimMachineOutput
	if msg := callTool(t, cs, "claim_machine", map[string]any{"pool": "agents", "wait": "0s"}, &first); msg != "" {
		t.Fatalf("claim_machine: %s", msg)
	}
	c := &kaironv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: first.Claim}, c); err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(c.Spec.TTLSeconds, 0) != 1800 || c.Spec.Egress == nil || !slices.Equal(c.Spec.Egress.AllowFqdns, ceiling.AllowFqdns) ||
		!slices.Equal(c.Spec.Egress.AllowPorts, ceiling.AllowPorts) || c.Labels[kaironctl.LabelMCPSession] != "s1" {
		t.Errorf("a claim without ttl or egress: spec %+v, labels %v; want the default TTL, the ceiling as egress, the session label", c.Spec, c.Labels)
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"pool": "agents", "wait": "0s"}, "this session holds 1 claims, the most this server allows (--max-claims 1)"},
	} {
		if msg := callTool(t, cs, "claim_machine", tc.args, nil); !strings.Contains(msg, tc.want) {
			t.Errorf("claim_machine %v: %q, want %q", tc.args, msg, tc.want)
		}
	}
	// Another session, or a claim made with kubectl, is not this one's.
	other := &kaironv1.MachineClaim{ObjectMeta: meta(ns, "by-kubectl"), Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}}
	env.Create(t, other)
	if msg := callTool(t, cs, "release_claim", map[string]any{"claim": "by-kubectl"}, nil); !strings.Contains(msg, `machineclaim/by-kubectl was not created by this MCP session (its `+kaironctl.LabelMCPSession+` label is "", this session is "s1")`) {
		t.Errorf("release_claim of a kubectl claim: %q", msg)
	}
	if msg := callTool(t, mcpSession(t, env, ns, kaironctl.MCPOptions{AllowWrite: true, Session: "s2"}), "release_claim", map[string]any{"claim": first.Claim}, nil); !strings.Contains(msg, "was not created by this MCP session") {
		t.Errorf("release_claim of another session's claim: %q", msg)
	}
	for _, name := range []string{first.Claim, "by-kubectl"} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &kaironv1.MachineClaim{}); err != nil {
			t.Errorf("claim %s after refused releases: %v", name, err)
		}
	}

	// With the first claim gone, the others are refused for what they ask.
	if err := env.Client.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the first claim gone", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), &kaironv1.MachineClaim{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"pool": "agents", "wait": "0s", "ttl": "3h"}, "ttl 3h0m0s is longer than this server allows (--max-ttl 2h0m0s)"},
		{map[string]any{"pool": "agents", "wait": "0s", "retain": true}, "retain is not allowed by this server (--no-retain)"},
		{map[string]any{"pool": "agents", "wait": "0s", "allow_fqdns": []string{"evil.com"}, "allow_ports": []string{"443"}}, `egress reaches past what this server allows (--egress-ceiling): allowFqdns[0] "evil.com"`},
		{map[string]any{"pool": "agents", "wait": "0s", "allow_fqdns": []string{"pypi.org"}}, "allowPorts is empty (every port)"},
		{map[string]any{"pool": "agents", "wait": "0s", "labels": map[string]string{kaironctl.LabelMCPSession: "s2"}}, "is reserved for Kairon's own labels"},
	} {
		msg := callTool(t, cs, "claim_machine", tc.args, nil)
		if !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
			t.Errorf("claim_machine %v: %q, want one line with %q", tc.args, msg, tc.want)
		}
	}
	if claims := listClaims(t, env, ns); len(claims) != 1 {
		t.Errorf("refused claims were created: %+v", claims)
	}
	var within kaironctl.ClaimMachineOutput
	if msg := callTool(t, cs, "claim_machine", map[string]any{"pool": "agents", "wait": "0s", "ttl": "1h", "allow_fqdns": []string{"files.pythonhosted.org"}, "allow_ports": []string{"443"}}, &within); msg != "" {
		t.Errorf("a claim within every limit: %s", msg)
	}
}
