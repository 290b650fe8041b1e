package controlplane

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/zyvor/kairon/config/admission"
	"github.com/zyvor/kairon/config/rbac"
)

// Kairon's identities in a control plane started with Options.KaironAccess.
// Each component has its own client certificate; the admin kubeconfig
// (system:masters) is the user's alone.
const (
	// ControllerUser and ControllersGroup are kairon-controller's
	// certificate (ControllerKubeconfig).
	ControllerUser   = "kairon:controller"
	ControllersGroup = "kairon:controllers"
	// NodeUserPrefix + the node name and NodesGroup are a node agent's
	// certificate (NodeKubeconfig). The node confinement policy takes the
	// node name from the user name.
	NodeUserPrefix = "kairon:node:"
	NodesGroup     = "kairon:nodes"
	// APIServerKubeletClientUser is the API server's client certificate
	// towards node agents (--kubelet-client-certificate), which the node
	// proxy presents for `kaironctl logs`.
	APIServerKubeletClientUser = "kube-apiserver-kubelet-client"
)

// Names of the RBAC and admission objects KaironAccess installs.
const (
	NodeClusterRole            = "kairon-node"
	NodeRegisterClusterRole    = "kairon-node-register"
	ControllerClusterRole      = "kairon-controller"
	ConsoleReaderClusterRole   = "kairon-console-reader"
	MachinePlacementPolicy     = "kairon-machine-placement"
	nodeRulesFile              = "node-agent.yaml"
	nodeRegisterRulesFile      = "node-agent-register.yaml"
	controllerRulesFile        = "controller.yaml"
	consoleReaderRulesFile     = "console-reader.yaml"
	machinePlacementPolicyFile = "machine-placement.yaml"
)

// Policies maps the name of each ValidatingAdmissionPolicy KaironAccess
// installs (and its binding's) to its file in config/admission.
var Policies = map[string]string{
	"kairon-node-confinement-nodes":           "node-confinement-nodes.yaml",
	"kairon-node-confinement-machines":        "node-confinement-machines.yaml",
	"kairon-node-confinement-migrations":      "node-confinement-migrations.yaml",
	"kairon-node-confinement-networkpolicies": "node-confinement-networkpolicies.yaml",
	"kairon-node-confinement-leases":          "node-confinement-leases.yaml",
	"kairon-node-confinement-snapshots":       "node-confinement-snapshots.yaml",
	MachinePlacementPolicy:                    machinePlacementPolicyFile,
	"kairon-claim-creation-stamp":             "claim-creation-stamp.yaml",
}

// ClaimFinalizerPolicy is the MutatingAdmissionPolicy (and binding) that
// puts the claim finalizer on every MachineClaim as the API server creates
// it, so that binding a claim takes no write of its own for it.
const ClaimFinalizerPolicy = "kairon-claim-finalizer"

// MutatingPolicies maps the name of each MutatingAdmissionPolicy
// KaironAccess installs (and its binding's) to its file in config/admission.
var MutatingPolicies = map[string]string{
	ClaimFinalizerPolicy: "claim-finalizer.yaml",
}

// ReadRules reads one file of config/rbac: a YAML list of PolicyRules.
func ReadRules(file string) ([]rbacv1.PolicyRule, error) {
	data, err := fs.ReadFile(rbac.Rules, file)
	if err != nil {
		return nil, err
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		return nil, fmt.Errorf("config/rbac/%s: %w", file, err)
	}
	return rules, nil
}

// ReadPolicy reads one file of config/admission: a
// ValidatingAdmissionPolicySpec, with nodeServiceAccount (the username of
// the node agents' ServiceAccount, or "" for none) in place of
// admission.NodeServiceAccountPlaceholder.
func ReadPolicy(file, nodeServiceAccount string) (*admissionregistrationv1.ValidatingAdmissionPolicySpec, error) {
	data, err := fs.ReadFile(admission.Policies, file)
	if err != nil {
		return nil, err
	}
	text := strings.ReplaceAll(string(data), admission.NodeServiceAccountPlaceholder, nodeServiceAccount)
	spec := &admissionregistrationv1.ValidatingAdmissionPolicySpec{}
	if err := yaml.UnmarshalStrict([]byte(text), spec); err != nil {
		return nil, fmt.Errorf("config/admission/%s: %w", file, err)
	}
	return spec, nil
}

// ReadMutatingPolicy reads one file of config/admission holding a
// MutatingAdmissionPolicySpec.
func ReadMutatingPolicy(file string) (*admissionregistrationv1.MutatingAdmissionPolicySpec, error) {
	data, err := fs.ReadFile(admission.Policies, file)
	if err != nil {
		return nil, err
	}
	spec := &admissionregistrationv1.MutatingAdmissionPolicySpec{}
	if err := yaml.UnmarshalStrict(data, spec); err != nil {
		return nil, fmt.Errorf("config/admission/%s: %w", file, err)
	}
	return spec, nil
}

// installMutatingPolicies installs the MutatingAdmissionPolicies. Nothing
// waits for the API server to apply them: what they do is an economy the
// controller makes up for until they are in force (it adds the claim
// finalizer itself to a claim that lacks it).
func installMutatingPolicies(ctx context.Context, cs kubernetes.Interface, labels map[string]string) error {
	for _, name := range slices.Sorted(maps.Keys(MutatingPolicies)) {
		spec, err := ReadMutatingPolicy(MutatingPolicies[name])
		if err != nil {
			return err
		}
		policy := &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: *spec}
		if err := apply(ctx, cs.AdmissionregistrationV1().MutatingAdmissionPolicies(), policy, func(have, want *admissionregistrationv1.MutatingAdmissionPolicy) {
			have.Spec, have.Labels = want.Spec, want.Labels
		}); err != nil {
			return fmt.Errorf("MutatingAdmissionPolicy %s: %w", name, err)
		}
		binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name},
		}
		if err := apply(ctx, cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings(), binding, func(have, want *admissionregistrationv1.MutatingAdmissionPolicyBinding) {
			have.Spec, have.Labels = want.Spec, want.Labels
		}); err != nil {
			return fmt.Errorf("MutatingAdmissionPolicyBinding %s: %w", name, err)
		}
	}
	return nil
}

// installAccess gives Kairon's components their RBAC roles and installs
// the admission policies that confine them, the same rules and policies
// the chart renders. Objects that exist are brought up to date, so a data
// dir from an older build gets the current ones.
func installAccess(ctx context.Context, cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	roles := []struct {
		name, file string
		subject    rbacv1.Subject
	}{
		{NodeClusterRole, nodeRulesFile, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: NodesGroup}},
		{NodeRegisterClusterRole, nodeRegisterRulesFile, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: NodesGroup}},
		{ControllerClusterRole, controllerRulesFile, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: ControllersGroup}},
		{ConsoleReaderClusterRole, consoleReaderRulesFile, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: APIServerKubeletClientUser}},
	}
	labels := map[string]string{"app.kubernetes.io/part-of": "kairon", "app.kubernetes.io/managed-by": "kairon-local"}
	for _, r := range roles {
		rules, err := ReadRules(r.file)
		if err != nil {
			return err
		}
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: r.name, Labels: labels}, Rules: rules}
		if err := apply(ctx, cs.RbacV1().ClusterRoles(), role, func(have, want *rbacv1.ClusterRole) { have.Rules, have.Labels = want.Rules, want.Labels }); err != nil {
			return fmt.Errorf("ClusterRole %s: %w", r.name, err)
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: r.name, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.name},
			Subjects:   []rbacv1.Subject{r.subject},
		}
		if err := apply(ctx, cs.RbacV1().ClusterRoleBindings(), binding, func(have, want *rbacv1.ClusterRoleBinding) { have.Subjects, have.Labels = want.Subjects, want.Labels }); err != nil {
			return fmt.Errorf("ClusterRoleBinding %s: %w", r.name, err)
		}
	}
	// Sorted, so that the node policies come last: waitForPolicies probes
	// those, and the API server takes in policies in the order they were made.
	names := slices.Sorted(maps.Keys(Policies))
	for _, name := range names {
		p := struct{ name, file string }{name, Policies[name]}
		spec, err := ReadPolicy(p.file, "")
		if err != nil {
			return err
		}
		policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: labels}, Spec: *spec}
		if err := apply(ctx, cs.AdmissionregistrationV1().ValidatingAdmissionPolicies(), policy, func(have, want *admissionregistrationv1.ValidatingAdmissionPolicy) {
			have.Spec, have.Labels = want.Spec, want.Labels
		}); err != nil {
			return fmt.Errorf("ValidatingAdmissionPolicy %s: %w", p.name, err)
		}
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        p.name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		}
		if err := apply(ctx, cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings(), binding, func(have, want *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			have.Spec, have.Labels = want.Spec, want.Labels
		}); err != nil {
			return fmt.Errorf("ValidatingAdmissionPolicyBinding %s: %w", p.name, err)
		}
	}
	if err := installMutatingPolicies(ctx, cs, labels); err != nil {
		return err
	}
	return waitForPolicies(ctx, cfg)
}

// waitForPolicies returns once the API server enforces the node
// confinement policies, which it takes in from watches a moment after they
// are made, each policy and each binding on its own: until then the first
// agent could write what they forbid. Each policy is probed with a dry run
// only it refuses: an agent creating another node's Node, a Machine and a
// MachineMigration. The probing user is also in system:masters, so RBAC
// lets the requests through to admission.
func waitForPolicies(ctx context.Context, cfg *rest.Config) error {
	probe := rest.CopyConfig(cfg)
	probe.Impersonate = rest.ImpersonationConfig{UserName: NodeUserPrefix + "kairon-access-probe", Groups: []string{NodesGroup, "system:masters"}}
	cs, err := kubernetes.NewForConfig(probe)
	if err != nil {
		return err
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	kairon := func(resource, body string) error {
		return cs.RESTClient().Post().AbsPath("/apis/kairon.zyvor.dev/v1alpha1/namespaces/default", resource).
			Param("dryRun", "All").Body([]byte(body)).SetHeader("Content-Type", "application/json").Do(ctx).Error()
	}
	probes := []struct {
		what, refusal string
		try           func() error
	}{
		{"Node", "may not write Node", func() error {
			_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kairon-access-probe-other"}}, dryRun)
			return err
		}},
		{"Machine", "a node agent may not create Machines", func() error {
			return kairon("machines", `{"apiVersion":"kairon.zyvor.dev/v1alpha1","kind":"Machine","metadata":{"name":"kairon-access-probe"},"spec":{}}`)
		}},
		{"MachineMigration", "a node agent may not create MachineMigrations", func() error {
			return kairon("machinemigrations", `{"apiVersion":"kairon.zyvor.dev/v1alpha1","kind":"MachineMigration","metadata":{"name":"kairon-access-probe"},"spec":{"machineName":"kairon-access-probe"}}`)
		}},
	}
	for _, p := range probes {
		var last error
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			last = p.try()
			return apierrors.IsForbidden(last) && strings.Contains(last.Error(), p.refusal), nil
		})
		if err != nil {
			return fmt.Errorf("the node confinement policy for %s is not enforced (last probe: %v): %w", p.what, last, err)
		}
	}
	return nil
}

// clusterAPI is the part of a typed client-go client apply needs.
type clusterAPI[T any] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
	Get(context.Context, string, metav1.GetOptions) (T, error)
}

// apply creates want, or copies it into the existing object with set.
func apply[T metav1.Object](ctx context.Context, api clusterAPI[T], want T, set func(have, want T)) error {
	_, err := api.Create(ctx, want, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := api.Get(ctx, want.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		set(have, want)
		_, err = api.Update(ctx, have, metav1.UpdateOptions{})
		return err
	})
}
