package testenv

import (
	"os/exec"
	"path/filepath"
	"strings"
)

// Kubectl runs the real, pinned kubectl of binDir against kubeconfig, with
// stdin on its standard input when stdin is not empty, and returns what it
// printed. A failure fails t with the command and its output: a test runs
// kubectl to act as a user does, so a refusal is the test's failure.
func Kubectl(t TB, binDir, kubeconfig, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Kubectl runs kubectl against the Env's API server; see Kubectl.
func (e *Env) Kubectl(t TB, args ...string) string {
	t.Helper()
	return Kubectl(t, e.BinDir, e.Kubeconfig, "", args...)
}

// KubectlStdin runs kubectl against the Env's API server with stdin on its
// standard input (for `apply -f -`); see Kubectl.
func (e *Env) KubectlStdin(t TB, stdin string, args ...string) string {
	t.Helper()
	return Kubectl(t, e.BinDir, e.Kubeconfig, stdin, args...)
}
