package kaironctl_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/kaironctl"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestMCPGuestTools: write_file, exec_in_machine and read_file through the
// real node agent to an in-process guest agent (guestsim), on this
// session's Machine only, with the output bounded.
func TestMCPGuestTools(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	nodeName := ns + "-n"
	gb := runGuestNode(t, env, nodeName)
	for _, name := range []string{"ours", "theirs"} {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
		if name == "ours" {
			m.Labels = map[string]string{kaironctl.LabelMCPSession: "test-session"}
		}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, guestWait, "machine "+name+" running", func() (bool, string) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
				return false, err.Error()
			}
			return m.Status.Phase == kaironv1.MachineRunning, string(m.Status.Phase)
		})
	}
	// A claim of the session bound to "ours".
	claim := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job", Labels: map[string]string{kaironctl.LabelMCPSession: "test-session"}},
		Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}}
	env.Create(t, claim)
	claim.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: "ours"}
	env.SetStatus(t, claim)

	cs := mcpSession(t, env, ns, writable)
	// guestsim's guest agent works on this host's files.
	script := filepath.Join(t.TempDir(), "job.sh")
	body := "#!/bin/sh\necho out; echo err >&2; exit 3\n"
	var wrote kaironctl.WriteFileOutput
	if msg := callTool(t, cs, "write_file", map[string]any{"claim": "job", "path": script, "content": body, "mode": "0755"}, &wrote); msg != "" {
		t.Fatalf("write_file: %s", msg)
	}
	if st, err := os.Stat(script); err != nil || st.Mode().Perm() != 0o755 || wrote.Bytes != len(body) {
		t.Fatalf("the script in the guest: %v %v, reported %+v", st, err, wrote)
	}
	var ran kaironctl.ExecInMachineOutput
	if msg := callTool(t, cs, "exec_in_machine", map[string]any{"claim": "job", "command": []string{script}}, &ran); msg != "" {
		t.Fatalf("exec_in_machine: %s", msg)
	}
	if ran.ExitCode != 3 || ran.Stdout != "out\n" || ran.Stderr != "err\n" || ran.StdoutTruncated {
		t.Errorf("exec_in_machine returned %+v, want exit 3, out, err", ran)
	}
	ran = kaironctl.ExecInMachineOutput{}
	if msg := callTool(t, cs, "exec_in_machine", map[string]any{"machine": "ours", "command": []string{"cat"}, "stdin": "hello\n"}, &ran); msg != "" || ran.Stdout != "hello\n" || ran.ExitCode != 0 {
		t.Errorf("exec_in_machine with stdin: %q %+v", msg, ran)
	}
	ran = kaironctl.ExecInMachineOutput{}
	if msg := callTool(t, cs, "exec_in_machine", map[string]any{"machine": "ours", "command": []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\000' a"}}, &ran); msg != "" {
		t.Fatalf("exec_in_machine, much output: %s", msg)
	}
	if !ran.StdoutTruncated || !strings.HasPrefix(ran.Stdout, strings.Repeat("a", 256<<10)) || !strings.HasSuffix(ran.Stdout, "truncated by kaironctl: more output than the tool returns ...]\n") ||
		len(ran.Stdout) > 256<<10+200 {
		t.Errorf("300000 bytes of output: truncated %v, %d bytes returned", ran.StdoutTruncated, len(ran.Stdout))
	}
	var read kaironctl.ReadFileOutput
	if msg := callTool(t, cs, "read_file", map[string]any{"machine": "ours", "path": script}, &read); msg != "" || read.Content != body || read.Truncated {
		t.Errorf("read_file: %q %+v", msg, read)
	}

	// Another's Machine: refused before the node is asked.
	before := gb.Guest(ns + "_theirs").Requests()
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"exec_in_machine", map[string]any{"machine": "theirs", "command": []string{"true"}}, "machine/theirs was not created by this MCP session"},
		{"write_file", map[string]any{"machine": "theirs", "path": script, "content": "x"}, "machine/theirs was not created by this MCP session"},
		{"read_file", map[string]any{"machine": "theirs", "path": script}, "machine/theirs was not created by this MCP session"},
		{"exec_in_machine", map[string]any{"machine": "ours", "command": []string{}}, "command is empty"},
		{"exec_in_machine", map[string]any{"claim": "job", "machine": "ours", "command": []string{"true"}}, "give claim or machine, not both"},
		{"write_file", map[string]any{"machine": "ours", "path": "relative", "content": "x"}, `path "relative" is not absolute`},
		{"write_file", map[string]any{"machine": "ours", "path": script, "content": "x", "mode": "rwx"}, `mode "rwx" is not octal`},
	} {
		if msg := callTool(t, cs, tc.tool, tc.args, nil); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
			t.Errorf("%s %v: %q, want one line with %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	if after := gb.Guest(ns + "_theirs").Requests(); after != before {
		t.Errorf("the refused calls reached the other Machine's guest: %d sessions, was %d", after, before)
	}
}

// TestMCPGuestToolsImpersonate (issue 42): kaironctl mcp serve --as runs
// the guest tools as the impersonated user on the node agent too: an
// admin serving as a tenant without create machines/exec gets the agent's
// 403 from exec_in_machine, read_file and write_file; granted, exec runs.
func TestMCPGuestToolsImpersonate(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	nodeName := ns + "-n"
	gb := runGuestNode(t, env, nodeName)
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ours", Labels: map[string]string{kaironctl.LabelMCPSession: "test-session"}},
		Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, guestWait, "machine ours running", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase == kaironv1.MachineRunning, string(m.Status.Phase)
	})
	tenant := "mcp-tenant-" + ns
	subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: tenant}
	bind(t, env, ns, "reader", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines", "machineclaims"}, Verbs: []string{"get", "list"}}}, subject)
	nodeReader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-reader-"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}}
	if err := env.Client.Create(ctx, nodeReader); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), nodeReader) })
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-reader-"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: nodeReader.Name}, Subjects: []rbacv1.Subject{subject}}
	if err := env.Client.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), crb) })

	cs := mcpSessionWith(t, env, ns, writable, func(f *genericclioptions.ConfigFlags) { *f.Impersonate = tenant })
	path := filepath.Join(t.TempDir(), "f")
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"exec_in_machine", map[string]any{"machine": "ours", "command": []string{"touch", path}}},
		{"write_file", map[string]any{"machine": "ours", "path": path, "content": "x"}},
		{"read_file", map[string]any{"machine": "ours", "path": "/etc/hostname"}},
	} {
		if msg := callTool(t, cs, c.tool, c.args, nil); !strings.Contains(msg, "node agent answered 403") || !strings.Contains(msg, "for user "+tenant+" (--as)") {
			t.Errorf("%s as the tenant: %q, want the agent's 403 for the tenant", c.tool, msg)
		}
	}
	if n := gb.Guest(ns + "_ours").Requests(); n != 0 {
		t.Errorf("the tenant's refused tools reached the guest: %d sessions", n)
	}
	bind(t, env, ns, "exec", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines/exec"}, Verbs: []string{"create"}}}, subject)
	testenv.Eventually(t, guestWait, "the tenant's exec_in_machine once granted", func() (bool, string) {
		var ran kaironctl.ExecInMachineOutput
		msg := callTool(t, cs, "exec_in_machine", map[string]any{"machine": "ours", "command": []string{"echo", "as tenant"}}, &ran)
		return msg == "" && ran.Stdout == "as tenant\n", fmt.Sprintf("%q %+v", msg, ran)
	})
}
