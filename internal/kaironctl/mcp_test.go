package kaironctl_test

// kaironctl mcp serve's tools, called by an MCP client connected in-process
// to the server, against the real API server. As in claim_test.go, the test
// plays kairon-controller where a tool waits for it.

import (
	"bytes"
	"context"
	"encoding/json"
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
func mcpSession(t *testing.T, env *testenv.Env, ns string, allowWrite bool) *mcp.ClientSession {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(true)
	*flags.KubeConfig = env.Kubeconfig
	*flags.Namespace = ns
	var out bytes.Buffer
	o := &kaironctl.Options{ConfigFlags: flags, Out: &out, ErrOut: &out, Now: time.Now}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := kaironctl.NewMCPServer(o, allowWrite).Connect(ctx, st, nil)
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
	if got := toolNames(t, mcpSession(t, env, ns, false)); !slices.Equal(got, []string{"list_machine_pools"}) {
		t.Errorf("read-only tools: %v", got)
	}
	want := []string{"claim_machine", "delete_machine", "list_machine_pools", "release_claim"}
	if got := toolNames(t, mcpSession(t, env, ns, true)); !slices.Equal(got, want) {
		t.Errorf("--allow-write tools: %v, want %v", got, want)
	}
	// A write tool is not there to call without --allow-write.
	res, err := mcpSession(t, env, ns, false).CallTool(context.Background(), &mcp.CallToolParams{Name: "claim_machine", Arguments: map[string]any{"pool": "agents"}})
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
	create(t, env, p)
	p.Status = kaironv1.MachinePoolStatus{Replicas: 3, Warm: 3, ReadyWarm: 2, Claimed: 1}
	setStatus(t, env, p)

	var out kaironctl.ListMachinePoolsOutput
	if msg := callTool(t, mcpSession(t, env, ns, false), "list_machine_pools", map[string]any{}, &out); msg != "" {
		t.Fatalf("tool error: %s", msg)
	}
	want := []kaironctl.MachinePoolSummary{{Namespace: ns, Name: "agents", Desired: 3, Warm: 3, ReadyWarm: 2, Claimed: 1}}
	if !slices.Equal(out.Pools, want) {
		t.Errorf("pools %+v, want %+v", out.Pools, want)
	}

	// all_namespaces finds it from a session configured for another namespace.
	out = kaironctl.ListMachinePoolsOutput{}
	if msg := callTool(t, mcpSession(t, env, env.Namespace(t), false), "list_machine_pools", map[string]any{"all_namespaces": true}, &out); msg != "" {
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
	cs := mcpSession(t, env, ns, true)

	// The Machine the fake controller binds, with an address.
	m := plainMachine(ns, "agents-8c21d0e4")
	create(t, env, m)
	m.Status.Phase = kaironv1.MachineRunning
	m.Status.Addresses = []kaironv1.MachineAddress{{Type: "InternalIP", Address: "10.88.0.7"}}
	setStatus(t, env, m)

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

	// delete_machine deletes a Machine.
	create(t, env, plainMachine(ns, "scratch"))
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
	cs := mcpSession(t, env, ns, true)
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
	for _, want := range []string{"--allow-write", "list_machine_pools", "claim_machine", "release_claim", "delete_machine"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help lacks %q:\n%s", want, r.stdout)
		}
	}
}
