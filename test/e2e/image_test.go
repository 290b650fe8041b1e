package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestMachineBootsAnOCIImage pulls an image from a registry on loopback
// and boots it on a real QEMU node: the image's files are the guest's
// root, exec and cp run in it with the image's user, directory and
// environment, its entrypoint's output is on the console, and its exit
// is on the Machine.
func TestMachineBootsAnOCIImage(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	digest := reg.Push(t, "team/tool:1", testenv.BusyboxImage(t, v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello from the image"},
		WorkingDir: "/home/app",
		User:       "app",
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo main process says $GREETING; exit 3"},
	}, map[string]testenv.ImageFile{"etc/motd": {Body: "made by the image\n"}}))
	netNS := netns(t)
	state := t.TempDir()
	t.Cleanup(func() { killVMs(t, state) })
	startController(t, env)
	a := startAgent(t, env, ns+"-img", state, netNS)
	deleteNodeAtEnd(t, env, ns+"-img")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(a.log)
			t.Logf("kairon-node log:\n%s", tail(string(out), 60))
		}
	})
	ref := reg.Ref("team/tool:1")
	env.KubectlStdin(t, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: tool\nspec:\n  image: "+ref+"\n", "-n", ns, "apply", "-f", "-")
	m := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "tool"}, kaironv1.MachineRunning)
	if m.Status.ImageDigest != digest {
		t.Errorf("status.imageDigest %q, want %s", m.Status.ImageDigest, digest)
	}

	kaironctl := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	for _, tc := range []struct{ args, want []string }{
		{[]string{"cat", "/etc/motd"}, []string{"made by the image"}},
		{[]string{"id"}, []string{"uid=1000(app) gid=1000(app)"}},
		{[]string{"pwd"}, []string{"/home/app"}},
		{[]string{"sh", "-c", "echo $GREETING"}, []string{"hello from the image"}},
		{[]string{"hostname"}, []string{"tool"}},
	} {
		out, stderr, code := kaironctl(append([]string{"exec", "tool", "--"}, tc.args...)...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) || code != 0 {
				t.Errorf("exec %v: %q %q exit %d, want %q", tc.args, out, stderr, code, w)
			}
		}
	}
	src := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(src, []byte("copied in\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := kaironctl("cp", src, "tool:/tmp/in.txt"); code != 0 {
		t.Fatalf("cp in: %s", stderr)
	}
	if out, stderr, code := kaironctl("exec", "tool", "--", "cat", "/tmp/in.txt"); out != "copied in\n" || code != 0 {
		t.Errorf("the copied file in the guest: %q %q exit %d", out, stderr, code)
	}

	testenv.Eventually(t, 2*time.Minute, "the MainProcess condition saying the entrypoint exited 3", func() (bool, string) {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(m), got); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(got.Status.Conditions, kaironv1.ConditionMainProcess.String())
		if c == nil {
			return false, "no MainProcess condition"
		}
		return c.Reason == kaironv1.MainProcessReasonFailed && strings.Contains(c.Message, "status 3"), c.Reason + ": " + c.Message
	})
	testenv.Eventually(t, time.Minute, "a MainProcessFailed event", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "events", FieldSelector: "involvedObject.name=tool,reason=MainProcessFailed"}, "{.items[*].message}")
		return strings.Contains(out, "exited with status 3"), out
	})
	console, err := os.ReadFile(filepath.Join(state, "instances", ns+"_tool", "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(console), "main process says hello from the image") {
		t.Errorf("the entrypoint's output is not on the console:\n%s", tail(string(console), 30))
	}
}
