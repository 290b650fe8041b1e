package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// readCRDs returns every CustomResourceDefinition in the .yaml/.yml files of
// fsys, in file-name order. Anything else in those files is an error: a
// stray manifest in the CRD set is a packaging mistake worth hearing about.
func readCRDs(fsys fs.FS) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := path.Ext(p); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading CRDs: %w", err)
	}
	slices.Sort(files)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, name := range files {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("reading CRDs: %w", err)
		}
		dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := dec.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("CRD file %s: %w", name, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 || isOnlyComments(doc) {
				continue
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict(doc, crd); err != nil {
				return nil, fmt.Errorf("CRD file %s: %w", name, err)
			}
			if crd.Kind != "CustomResourceDefinition" || crd.APIVersion != apiextensionsv1.SchemeGroupVersion.String() {
				return nil, fmt.Errorf("CRD file %s: holds a %s %s, not an apiextensions.k8s.io/v1 CustomResourceDefinition", name, crd.APIVersion, crd.Kind)
			}
			crds = append(crds, crd)
		}
	}
	return crds, nil
}

func isOnlyComments(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// applyCRDs creates each CRD or replaces its spec, so that a data dir started
// by an older build picks up the current schemas, then waits until every CRD
// is Established and its resources are served by discovery. The discovery
// wait matters to callers that build a RESTMapper right after Start.
func applyCRDs(ctx context.Context, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	if len(crds) == 0 {
		return nil
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, want := range crds {
		_, err := api.Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				upd := want.DeepCopy()
				upd.ResourceVersion = have.ResourceVersion
				_, err = api.Update(ctx, upd, metav1.UpdateOptions{})
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("applying CRD %s: %w", want.Name, err)
		}
	}
	for _, want := range crds {
		if err := waitEstablished(ctx, cs, want); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, cs apiextensionsclient.Interface, want *apiextensionsv1.CustomResourceDefinition) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		established := false
		for _, c := range crd.Status.Conditions {
			switch {
			case c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse:
				return false, fmt.Errorf("CRD %s: names not accepted: %s", want.Name, c.Message)
			case c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue:
				established = true
			}
		}
		if !established {
			last = "not Established yet"
			return false, nil
		}
		for _, v := range want.Spec.Versions {
			if !v.Served {
				continue
			}
			gv := want.Spec.Group + "/" + v.Name
			list, err := cs.Discovery().ServerResourcesForGroupVersion(gv)
			if err != nil {
				last = fmt.Sprintf("%s not in discovery yet: %v", gv, err)
				return false, nil
			}
			if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == want.Spec.Names.Plural }) {
				last = fmt.Sprintf("%s %s not in discovery yet", gv, want.Spec.Names.Plural)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("CRD %s did not become established (%s): %w", want.Name, last, err)
	}
	return err
}
