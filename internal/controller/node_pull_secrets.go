package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/requeue"
)

// A node agent pulls a Machine's OCI image with the Secrets its
// spec.imagePullSecrets names, and may read those alone: the Secrets named
// by the Machines placed on its node (spec.nodeName) or on their way to it
// (a migration's target, kairon.zyvor.dev/migration-target, pulls before
// the guest arrives). Reads pass no admission policy, so the node
// confinement policies cannot see them; RBAC can, and this controller
// keeps it: per namespace and node, a Role granting get on exactly those
// Secrets (resourceNames) and a RoleBinding of it to the node's user,
// updated as Machines come, go and move, and deleted with the last one.
// Both carry labelNodePullSecrets, so that after a restart the controller
// finds and settles every grant it made, and the binding is owned by the
// Role. A built-in image pulls nothing and grants nothing.
//
// RBAC lets the controller grant only what it holds itself: it has get on
// Secrets (by name; no list or watch, config/rbac/controller.yaml), which
// it also needs to resolve a pool's image.

const (
	// labelNodePullSecrets marks the Roles and RoleBindings of these
	// grants.
	labelNodePullSecrets = "kairon.zyvor.dev/node-pull-secrets"
	// annotationPullSecretsNode names the node a grant is for (node names
	// are longer than a label value may be).
	annotationPullSecretsNode = "kairon.zyvor.dev/pull-secrets-node"
	// nodePullSecretsRolePrefix + the node name is the Role and the
	// RoleBinding of a node's grant in a namespace.
	nodePullSecretsRolePrefix = "kairon:node-pull-secrets:"
	// nodeUserPrefix + the node name is a node agent's user, as
	// kairon-local issues its certificate (controlplane.NodeUserPrefix).
	nodeUserPrefix = "kairon:node:"
	// pullSecretNodeIndex: Machines by the nodes that may read their
	// pull secrets.
	pullSecretNodeIndex = "kairon.pullSecretNode"
)

// NodePullSecretsReconciler keeps the RBAC that lets each node agent read
// the pull secrets of its Machines, and no other Secret. Its requests are
// namespace/node pairs: Name is the node.
type NodePullSecretsReconciler struct {
	// Client reads Machines from the cache and writes the Roles and
	// RoleBindings.
	Client client.Client
	// APIReader reads the Roles and RoleBindings, whose cache holds only
	// their metadata.
	APIReader client.Reader
	// Subject is the identity of node's agent; nil means the user
	// kairon:node:<node> that kairon-local issues.
	Subject func(node string) rbacv1.Subject
}

// SetupWithManager registers the reconciler with mgr.
func (r *NodePullSecretsReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.Subject == nil {
		r.Subject = nodeUser
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &kaironv1.Machine{}, pullSecretNodeIndex, func(o client.Object) []string {
		if o.GetDeletionTimestamp() != nil {
			return nil
		}
		return pullSecretNodes(o.(*kaironv1.Machine))
	}); err != nil {
		return fmt.Errorf("indexing machines by the nodes that pull their images: %w", err)
	}
	return builder.ControllerManagedBy(mgr).
		Named("node-pull-secrets").
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(machinePullSecretGrants),
			builder.WithPredicates(pullSecretsChanged())).
		// Metadata only: a grant's label and node are all the map needs,
		// and the controller has no use for a cache of every Role.
		WatchesMetadata(&rbacv1.Role{}, handler.EnqueueRequestsFromMapFunc(grantOf), builder.WithPredicates(isPullSecretGrant())).
		WatchesMetadata(&rbacv1.RoleBinding{}, handler.EnqueueRequestsFromMapFunc(grantOf), builder.WithPredicates(isPullSecretGrant())).
		Complete(requeue.UntilStopped(r))
}

func nodeUser(node string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: nodeUserPrefix + node}
}

// pullSecretNodes are the nodes that may read m's pull secrets: the one it
// is placed on, and the target of its migration. None for a built-in
// image, or a Machine that names no secret.
func pullSecretNodes(m *kaironv1.Machine) []string {
	if !kaironv1.IsOCIImage(m.Spec.Image) || !slices.ContainsFunc(m.Spec.ImagePullSecrets, func(s corev1.LocalObjectReference) bool { return s.Name != "" }) {
		return nil
	}
	var nodes []string
	if m.Spec.NodeName != "" {
		nodes = append(nodes, m.Spec.NodeName)
	}
	if target := m.Annotations[kaironv1.AnnotationMachineMigrationTarget]; target != "" && target != m.Spec.NodeName {
		nodes = append(nodes, target)
	}
	return nodes
}

// machinePullSecretGrants maps a Machine to the grants it takes part in.
// An update is mapped for the old and the new Machine both, so a Machine
// that moves or drops its secrets settles the grant it leaves; a
// terminating one is mapped too, and its grant dropped.
func machinePullSecretGrants(_ context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*kaironv1.Machine)
	if !ok {
		return nil
	}
	var reqs []reconcile.Request
	for _, node := range pullSecretNodes(m) {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: node}})
	}
	return reqs
}

// pullSecretsChanged passes the Machine updates that change who may read
// its secrets.
func pullSecretsChanged() predicate.Funcs {
	return updatesThat(func(old, cur *kaironv1.Machine) bool {
		return old.Spec.NodeName != cur.Spec.NodeName || old.Spec.Image != cur.Spec.Image ||
			!equality.Semantic.DeepEqual(old.Spec.ImagePullSecrets, cur.Spec.ImagePullSecrets) ||
			old.Annotations[kaironv1.AnnotationMachineMigrationTarget] != cur.Annotations[kaironv1.AnnotationMachineMigrationTarget] ||
			(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil)
	})
}

func isPullSecretGrant() predicate.Funcs {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[labelNodePullSecrets] == "true" && o.GetAnnotations()[annotationPullSecretsNode] != ""
	})
}

// grantOf maps a grant's Role or RoleBinding to its namespace and node: one
// changed or deleted by someone else is put back, and after a restart
// every grant is looked at once.
func grantOf(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetAnnotations()[annotationPullSecretsNode]}}}
}

// Reconcile makes node's grant in the namespace what its Machines need.
func (r *NodePullSecretsReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ns, node := req.Namespace, req.Name
	var machines kaironv1.MachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(ns), client.MatchingFields{pullSecretNodeIndex: node}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the machines of node %s: %w", node, err)
	}
	secrets := map[string]bool{}
	for _, m := range machines.Items {
		for _, s := range m.Spec.ImagePullSecrets {
			if s.Name != "" {
				secrets[s.Name] = true
			}
		}
	}
	name := nodePullSecretsRolePrefix + node
	if len(secrets) == 0 {
		return reconcile.Result{}, r.revoke(ctx, ns, name, node)
	}
	role, err := r.ensureRole(ctx, ns, name, node, slices.Sorted(maps.Keys(secrets)))
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.ensureBinding(ctx, role, node)
}

// grantMeta is the metadata of node's Role and RoleBinding.
func grantMeta(ns, name, node string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: ns, Name: name,
		Labels: map[string]string{
			labelNodePullSecrets:           "true",
			"app.kubernetes.io/managed-by": "kairon-controller",
		},
		Annotations: map[string]string{annotationPullSecretsNode: node},
	}
}

func (r *NodePullSecretsReconciler) ensureRole(ctx context.Context, ns, name, node string, secrets []string) (*rbacv1.Role, error) {
	want := &rbacv1.Role{
		ObjectMeta: grantMeta(ns, name, node),
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: secrets,
		}},
	}
	have := &rbacv1.Role{}
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want); err != nil {
			return nil, fmt.Errorf("creating role %s/%s granting node %s its pull secrets: %w", ns, name, node, err)
		}
		log.FromContext(ctx).Info("Granted a node its machines' pull secrets", "role", klog.KObj(want), "node", node, "secrets", secrets)
		return want, nil
	case err != nil:
		return nil, fmt.Errorf("reading role %s/%s: %w", ns, name, err)
	}
	if equality.Semantic.DeepEqual(have.Rules, want.Rules) && hasGrantMeta(have, node) {
		return have, nil
	}
	have.Rules = want.Rules
	mergeGrantMeta(have, want)
	if err := r.Client.Update(ctx, have); err != nil {
		return nil, fmt.Errorf("updating role %s/%s granting node %s its pull secrets: %w", ns, name, node, err)
	}
	log.FromContext(ctx).Info("Changed the pull secrets a node may read", "role", klog.KObj(have), "node", node, "secrets", secrets)
	return have, nil
}

func (r *NodePullSecretsReconciler) ensureBinding(ctx context.Context, role *rbacv1.Role, node string) error {
	want := &rbacv1.RoleBinding{
		ObjectMeta: grantMeta(role.Namespace, role.Name, node),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{r.subject(node)},
	}
	// Owned by its Role: deleting the Role, by hand too, takes it along.
	want.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "Role", Name: role.Name, UID: role.UID,
	}}
	have := &rbacv1.RoleBinding{}
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want); err != nil {
			return fmt.Errorf("creating rolebinding %s/%s granting node %s its pull secrets: %w", want.Namespace, want.Name, node, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading rolebinding %s/%s: %w", want.Namespace, want.Name, err)
	case have.RoleRef != want.RoleRef:
		// A binding's roleRef cannot change: this one is not ours as
		// made, so it goes, and the next pass makes it anew.
		if err := r.Client.Delete(ctx, have, client.Preconditions{UID: ptr.To(have.UID)}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting rolebinding %s/%s, which binds %s %s: %w", have.Namespace, have.Name, have.RoleRef.Kind, have.RoleRef.Name, err)
		}
		return fmt.Errorf("rolebinding %s/%s bound %s %s; deleted, to be made again", have.Namespace, have.Name, have.RoleRef.Kind, have.RoleRef.Name)
	}
	if equality.Semantic.DeepEqual(have.Subjects, want.Subjects) && equality.Semantic.DeepEqual(have.OwnerReferences, want.OwnerReferences) && hasGrantMeta(have, node) {
		return nil
	}
	have.Subjects, have.OwnerReferences = want.Subjects, want.OwnerReferences
	mergeGrantMeta(have, want)
	if err := r.Client.Update(ctx, have); err != nil {
		return fmt.Errorf("updating rolebinding %s/%s: %w", have.Namespace, have.Name, err)
	}
	return nil
}

// revoke deletes node's grant in ns: the binding first, so that nothing
// is left bound to a Role on its way out.
func (r *NodePullSecretsReconciler) revoke(ctx context.Context, ns, name, node string) error {
	meta := metav1.ObjectMeta{Namespace: ns, Name: name}
	binding := &rbacv1.RoleBinding{ObjectMeta: meta}
	if err := r.Client.Delete(ctx, binding); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting rolebinding %s/%s: %w", ns, name, err)
	} else if err == nil {
		log.FromContext(ctx).Info("Node has no machine with pull secrets here any more; revoked its grant", "rolebinding", klog.KRef(ns, name), "node", node)
	}
	if err := r.Client.Delete(ctx, &rbacv1.Role{ObjectMeta: meta}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting role %s/%s: %w", ns, name, err)
	}
	return nil
}

func (r *NodePullSecretsReconciler) subject(node string) rbacv1.Subject {
	if r.Subject == nil {
		return nodeUser(node)
	}
	return r.Subject(node)
}

func hasGrantMeta(o metav1.Object, node string) bool {
	return o.GetLabels()[labelNodePullSecrets] == "true" && o.GetAnnotations()[annotationPullSecretsNode] == node
}

// mergeGrantMeta puts want's labels and annotations on have, keeping
// others'.
func mergeGrantMeta(have, want metav1.Object) {
	labels, annotations := have.GetLabels(), have.GetAnnotations()
	if labels == nil {
		labels = map[string]string{}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	maps.Copy(labels, want.GetLabels())
	maps.Copy(annotations, want.GetAnnotations())
	have.SetLabels(labels)
	have.SetAnnotations(annotations)
}
