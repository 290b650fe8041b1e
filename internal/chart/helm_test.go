package chart

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/zyvor/kairon/internal/testenv"
)

// testNamespace is the namespace every `helm template` renders into.
const testNamespace = "kairon-system"

// testRelease is the release name every `helm template` uses, so object
// names are testRelease-kairon-controller and so on.
const testRelease = "kt"

// repoRoot is the Kairon checkout; go test runs in internal/chart.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "charts", "kairon", "Chart.yaml")); err != nil {
		t.Fatalf("no charts/kairon/Chart.yaml under %s: %v", root, err)
	}
	return root
}

// chartDir is charts/kairon. It also reads every file of the chart once:
// helm reads them in a subprocess, which go test cannot see, and a file the
// test process opens is one whose change invalidates go test's cached
// result. Without this, editing a template would leave a stale "ok (cached)".
func chartDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "charts", "kairon")
	chartFilesOnce.Do(func() {
		chartFilesErr = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			_, err = os.ReadFile(path)
			return err
		})
	})
	if chartFilesErr != nil {
		t.Fatalf("reading the chart: %v", chartFilesErr)
	}
	return dir
}

var (
	chartFilesOnce sync.Once
	chartFilesErr  error
)

// helmBin is the pinned helm that hack/tools builds into bin/.
func helmBin(t testing.TB) string {
	t.Helper()
	path := filepath.Join(testenv.BinDir(t), "helm")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no helm in %s: run `make tools`", filepath.Dir(path))
	}
	return path
}

// runHelm runs bin/helm with its config, cache and data kept in a temporary
// directory, so the tests neither read nor write the user's.
func runHelm(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// mustHelm runs bin/helm and fails the test if it fails.
func mustHelm(t testing.TB, args ...string) string {
	t.Helper()
	out, errOut, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// setArgs turns "key=value" pairs into --set flags.
func setArgs(sets []string) []string {
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// manifests is a rendered chart: every object by "Kind/name".
type manifests map[string][]byte

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// render runs `helm template` with extra flags (usually --set) and parses
// every document it prints.
func render(t testing.TB, flags ...string) manifests {
	t.Helper()
	args := append([]string{"template", testRelease, chartDir(t), "--namespace", testNamespace}, flags...)
	out := mustHelm(t, args...)
	objs := manifests{}
	for _, doc := range docSeparator.Split(out, -1) {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}
		if string(js) == "null" {
			continue // only comments
		}
		if err := json.Unmarshal(js, &head); err != nil {
			t.Fatalf("rendered document is not an object: %v\n%s", err, doc)
		}
		if head.Kind == "" || head.Metadata.Name == "" {
			t.Fatalf("rendered document without kind or name:\n%s", doc)
		}
		key := head.Kind + "/" + head.Metadata.Name
		if _, dup := objs[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		objs[key] = js
	}
	return objs
}

// renderError runs `helm template` expecting it to fail and returns what it
// printed on stderr.
func renderError(t testing.TB, flags ...string) string {
	t.Helper()
	args := append([]string{"template", testRelease, chartDir(t), "--namespace", testNamespace}, flags...)
	out, errOut, err := runHelm(t, args...)
	if err == nil {
		t.Fatalf("helm %s succeeded, want an error; it rendered:\n%s", strings.Join(args, " "), out)
	}
	return errOut
}

// keys lists the rendered objects, sorted.
func (m manifests) keys() []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func (m manifests) has(kind, name string) bool {
	_, ok := m[kind+"/"+name]
	return ok
}

// get decodes one rendered object into out, strictly: a field the Go type
// does not know (a typo in a template) fails the test.
func get(t testing.TB, m manifests, kind, name string, out any) {
	t.Helper()
	js, ok := m[kind+"/"+name]
	if !ok {
		t.Fatalf("%s/%s not rendered; rendered: %s", kind, name, strings.Join(m.keys(), ", "))
	}
	if err := yaml.UnmarshalStrict(js, out); err != nil {
		t.Fatalf("%s/%s: %v\n%s", kind, name, err, js)
	}
}

// getMap decodes a rendered object of a kind without Go types here
// (ServiceMonitor, PrometheusRule).
func getMap(t testing.TB, m manifests, kind, name string) map[string]any {
	t.Helper()
	var obj map[string]any
	get(t, m, kind, name, &obj)
	return obj
}

// allows reports whether rules grant verb on group/resource, the way RBAC
// evaluates them (including wildcards).
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// verbsOn lists what rules grant on group/resource, sorted.
func verbsOn(rules []rbacv1.PolicyRule, group, resource string) []string {
	var verbs []string
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) {
			verbs = append(verbs, r.Verbs...)
		}
	}
	slices.Sort(verbs)
	return slices.Compact(verbs)
}
