package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestMCPAgentSessionOnARealGuest is the agent's whole round, as
// docs/guides/hermes-mcp.md shows it: an MCP client (the go-sdk's) starts
// `kaironctl mcp serve --allow-write` (the bin/ binary) as a subprocess,
// claims a warm QEMU guest, writes a script into it, runs it, reads the
// file the script wrote, and releases the claim.
func TestMCPAgentSessionOnARealGuest(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	// The warm member and the replacement the pool boots once it is claimed.
	startPoolNode(t, env, ns, "e2e-mcp", 4, "2Gi")
	env.KubectlStdin(t, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: MachinePool\nmetadata: {name: agents}\nspec:\n  replicas: 1\n  template:\n    spec: {cpu: 1, memory: 256Mi}\n", "-n", ns, "apply", "-f", "-")
	testenv.Eventually(t, 4*time.Minute, "a Running warm member", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machines", LabelSelector: kaironv1.LabelPoolState + "=" + kaironv1.PoolStateWarm}, "{.items[*].status.phase}")
		return strings.Contains(out, "Running"), out
	})

	serve := exec.Command(filepath.Join(env.BinDir, "kaironctl"), "--kubeconfig", env.Kubeconfig, "-n", ns,
		"mcp", "serve", "--allow-write", "--max-claims", "1", "--default-ttl", "10m", "--no-retain")
	session, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent"}, nil).Connect(ctx, &mcp.CommandTransport{Command: serve}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Close() })
	call := func(tool string, args map[string]any, out any) {
		t.Helper()
		callCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		res, err := session.CallTool(callCtx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if res.IsError {
			var msgs []string
			for _, c := range res.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					msgs = append(msgs, tc.Text)
				}
			}
			t.Fatalf("%s %v: tool error: %s", tool, args, strings.Join(msgs, "; "))
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %s: %v", tool, b, err)
		}
		t.Logf("%s → %s", tool, b)
	}

	var claimed struct{ Claim, Machine string }
	call("claim_machine", map[string]any{"pool": "agents"}, &claimed)
	if claimed.Claim == "" || claimed.Machine == "" {
		t.Fatalf("claim_machine returned %+v", claimed)
	}
	var wrote struct{ Bytes int }
	call("write_file", map[string]any{"claim": claimed.Claim, "path": "/tmp/job.sh", "mode": "0755",
		"content": "#!/bin/sh\necho \"answer: $((6 * 7))\" > /tmp/result.txt\nuname -s\n"}, &wrote)
	var ran struct {
		ExitCode int `json:"exit_code"`
		Stdout   string
		Stderr   string
	}
	call("exec_in_machine", map[string]any{"claim": claimed.Claim, "command": []string{"/tmp/job.sh"}}, &ran)
	if ran.ExitCode != 0 || ran.Stdout != "Linux\n" {
		t.Errorf("the script in the guest: exit %d, stdout %q, stderr %q", ran.ExitCode, ran.Stdout, ran.Stderr)
	}
	var read struct{ Content string }
	call("read_file", map[string]any{"claim": claimed.Claim, "path": "/tmp/result.txt"}, &read)
	if read.Content != "answer: 42\n" {
		t.Errorf("the file the script wrote: %q", read.Content)
	}
	var released struct {
		MachineResult string `json:"machine_result"`
	}
	call("release_claim", map[string]any{"claim": claimed.Claim}, &released)
	if released.MachineResult != "deleted" {
		t.Errorf("release_claim: machine %q", released.MachineResult)
	}
	for _, obj := range []client.Object{&kaironv1.MachineClaim{}, &kaironv1.Machine{}} {
		name := claimed.Claim
		if _, ok := obj.(*kaironv1.Machine); ok {
			name = claimed.Machine
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after release_claim: %v", obj, name, fmt.Sprint(err))
		}
	}
}
