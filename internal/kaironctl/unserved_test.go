package kaironctl

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/zyvor/kairon/config/crd"
)

// The kinds table maps Kairon's kinds without asking the API server, so it
// must say exactly what the CRDs say: every CRD's kind, resource names and
// scope.
func TestTableMapperMatchesTheCRDs(t *testing.T) {
	m := tableMapper()
	files, err := fs.Glob(crd.Bases, "bases/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs embedded: %v", err)
	}
	for _, f := range files {
		data, err := crd.Bases.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var def apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &def); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		names := def.Spec.Names
		for _, v := range def.Spec.Versions {
			if !v.Served {
				continue
			}
			t.Run(names.Kind+"/"+v.Name, func(t *testing.T) {
				mapping, err := m.RESTMapping(schema.GroupKind{Group: def.Spec.Group, Kind: names.Kind}, v.Name)
				if err != nil {
					t.Fatalf("not in the kinds table: %v", err)
				}
				if mapping.Resource.Resource != names.Plural || mapping.Resource.Group != def.Spec.Group || mapping.Resource.Version != v.Name {
					t.Errorf("mapped to %v, the CRD serves %s.%s/%s", mapping.Resource, names.Plural, def.Spec.Group, v.Name)
				}
				namespaced := def.Spec.Scope == apiextensionsv1.NamespaceScoped
				if got := mapping.Scope.Name() == meta.RESTScopeNameNamespace; got != namespaced {
					t.Errorf("namespaced %v, the CRD's scope is %s", got, def.Spec.Scope)
				}
				singular, err := m.ResourceSingularizer(names.Plural)
				if err != nil || singular != names.Singular {
					t.Errorf("singular of %s is %q (%v), the CRD says %q", names.Plural, singular, err, names.Singular)
				}
			})
		}
	}
}

// notServingKairon is an API server without Kairon's CRDs: every path of
// the group answers as the API server does for a path it does not serve
// (a plain-text 404, no Status). It records what it was asked.
type notServingKairon struct {
	mu    sync.Mutex
	paths []string
}

func (s *notServingKairon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.paths = append(s.paths, r.Method+" "+r.URL.Path)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintln(w, "404 page not found")
}

func (s *notServingKairon) asked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.paths)
}

// Against a cluster without Kairon every command says so, instead of
// "not found" (which `release` and `delete` would take for done), and
// none of them asks discovery first.
func TestKindNotServed(t *testing.T) {
	srv := &notServingKairon{}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	kubeconfig := fakeKubeconfig(t, ts.URL)
	for _, tc := range []struct {
		args     []string
		resource string
	}{
		{[]string{"get", "machines"}, "machines.kairon.zyvor.dev"},
		{[]string{"get", "pool", "agents", "-o", "yaml"}, "machinepools.kairon.zyvor.dev"},
		{[]string{"describe", "mnp", "p"}, "machinenetworkpolicies.kairon.zyvor.dev"},
		{[]string{"claim", "agents"}, "machinepools.kairon.zyvor.dev"},
		{[]string{"release", "agents-claim-1"}, "machineclaims.kairon.zyvor.dev"},
		{[]string{"delete", "machine", "web-1"}, "machines.kairon.zyvor.dev"},
		{[]string{"scale", "pool", "agents", "--replicas", "3"}, "machinepools.kairon.zyvor.dev"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), append([]string{"--kubeconfig", kubeconfig}, tc.args...), &stdout, &stderr)
			if code != 1 {
				t.Errorf("exit %d, want 1; stdout %q", code, stdout.String())
			}
			want := "the API server does not serve " + tc.resource + ": is Kairon installed in this cluster"
			if !strings.Contains(stderr.String(), want) || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("stderr %q, want one line containing %q", stderr.String(), want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
		})
	}
	for _, p := range srv.asked() {
		if !strings.Contains(p, "/apis/kairon.zyvor.dev/v1alpha1/") {
			t.Errorf("asked %s: only Kairon's own paths were needed (no discovery)", p)
		}
	}
}
