package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	kaironadmission "github.com/zyvor/kairon/config/admission"
)

// PolicyStatusWebhookPath is where the validating webhook for the node
// agents' writes of MachineNetworkPolicy status is served.
const PolicyStatusWebhookPath = "/validate-machinenetworkpolicy-status"

// PolicyStatusValidator keeps each entry of a MachineNetworkPolicy's
// status.nodes to Machines placed on that entry's node (issue 42). The
// ValidatingAdmissionPolicy node-confinement-networkpolicies.yaml already
// keeps a node agent to its own entry, but cannot look Machines up: a
// compromised node-1 could list a node-2 Machine in its own entry, and the
// entries are what a claim's EgressEnforced trusts. Here every Machine a
// write adds to an entry must exist in the policy's namespace with
// spec.nodeName the entry's node, read from the API server at the moment
// of the write; a Machine the API server cannot be asked about is refused
// too (fail closed).
//
// Only added names are looked up: one Get per Machine that enters an
// entry, not one per Machine an entry lists, on the path of every egress
// bind. A name already in the entry was judged when it entered; if its
// Machine moved or went since, the entry no longer counts for it
// (EgressEnforcement reads only the entry of the Machine's current node)
// and the agent drops it on its next report.
//
// The API server sends only the node agents' writes
// (PolicyStatusWebhookMatchConditions, the policy's own match condition),
// but the rule holds for any writer.
type PolicyStatusValidator struct {
	// Reader should read from the API server, not a cache: a Machine just
	// placed on the node must be found there.
	Reader client.Reader
}

var _ admission.Validator[*kaironv1.MachineNetworkPolicy] = &PolicyStatusValidator{}

// NewPolicyStatusWebhook returns the admission webhook to serve at
// PolicyStatusWebhookPath.
func NewPolicyStatusWebhook(scheme *runtime.Scheme, reader client.Reader) *admission.Webhook {
	return admission.WithValidator[*kaironv1.MachineNetworkPolicy](scheme, &PolicyStatusValidator{Reader: reader})
}

// ValidateCreate allows every creation: a new policy has no status.
func (v *PolicyStatusValidator) ValidateCreate(context.Context, *kaironv1.MachineNetworkPolicy) (admission.Warnings, error) {
	return nil, nil
}

// ValidateUpdate refuses (403) a write that adds to an entry of
// status.nodes a Machine that does not exist or is not placed on the
// entry's node, naming the Machine.
func (v *PolicyStatusValidator) ValidateUpdate(ctx context.Context, oldPolicy, policy *kaironv1.MachineNetworkPolicy) (admission.Warnings, error) {
	before := map[string][]string{}
	for _, e := range oldPolicy.Status.Nodes {
		before[e.Node] = append(before[e.Node], e.Machines...)
	}
	for _, e := range policy.Status.Nodes {
		for _, name := range e.Machines {
			if slices.Contains(before[e.Node], name) {
				continue
			}
			if err := v.placedOn(ctx, policy, e.Node, name); err != nil {
				return nil, err
			}
		}
	}
	return nil, nil
}

// ValidateDelete allows every deletion.
func (v *PolicyStatusValidator) ValidateDelete(context.Context, *kaironv1.MachineNetworkPolicy) (admission.Warnings, error) {
	return nil, nil
}

// placedOn is nil if Machine name of policy's namespace is placed on node,
// else the refusal.
func (v *PolicyStatusValidator) placedOn(ctx context.Context, policy *kaironv1.MachineNetworkPolicy, node, name string) error {
	var m kaironv1.Machine
	err := v.Reader.Get(ctx, client.ObjectKey{Namespace: policy.Namespace, Name: name}, &m)
	var why string
	switch {
	case apierrors.IsNotFound(err):
		why = "which does not exist"
	case err != nil:
		return apierrors.NewInternalError(fmt.Errorf("looking up machine %s/%s named in the status.nodes entry of node %s: %w", policy.Namespace, name, node, err))
	case m.Spec.NodeName == node:
		return nil
	case m.Spec.NodeName == "":
		why = "which is placed on no node"
	default:
		why = "which is placed on node " + m.Spec.NodeName
	}
	writer := "the writer"
	if req, err := admission.RequestFromContext(ctx); err == nil && req.UserInfo.Username != "" {
		writer = "user " + req.UserInfo.Username
	}
	return apierrors.NewForbidden(kaironv1.GroupVersion.WithResource("machinenetworkpolicies").GroupResource(), policy.Name,
		fmt.Errorf("%s may list in the status.nodes entry of node %s only Machines placed on %s: machine %s/%s is not, %s",
			writer, node, node, policy.Namespace, name, why))
}

// policyStatusPolicyFile is the ValidatingAdmissionPolicy whose match
// condition tells the node agents' writes of policy status apart.
const policyStatusPolicyFile = "node-confinement-networkpolicies.yaml"

// PolicyStatusWebhookMatchConditions are the match conditions of the
// policy-status webhook: those of node-confinement-networkpolicies.yaml,
// so that the webhook sees exactly the writes the policy judges as a node
// agent's, with nodeServiceAccount (the node agents' ServiceAccount user
// name, "" if there is none) in place of its placeholder. The chart
// renders the same from its copy of the file.
func PolicyStatusWebhookMatchConditions(nodeServiceAccount string) ([]admissionregistrationv1.MatchCondition, error) {
	data, err := kaironadmission.Policies.ReadFile(policyStatusPolicyFile)
	if err != nil {
		return nil, err
	}
	text := strings.ReplaceAll(string(data), kaironadmission.NodeServiceAccountPlaceholder, nodeServiceAccount)
	var spec admissionregistrationv1.ValidatingAdmissionPolicySpec
	if err := yaml.Unmarshal([]byte(text), &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", policyStatusPolicyFile, err)
	}
	conditions := make([]admissionregistrationv1.MatchCondition, len(spec.MatchConditions))
	for i, c := range spec.MatchConditions {
		conditions[i] = admissionregistrationv1.MatchCondition(c)
	}
	return conditions, nil
}
