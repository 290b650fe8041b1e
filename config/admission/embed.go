// Package admission holds the specs of Kairon's ValidatingAdmissionPolicies
// (admissionregistration.k8s.io/v1), which the API server enforces without a
// webhook: node-confinement.yaml confines node agents to their own node,
// machine-placement.yaml keeps placement with the scheduler. It also holds
// the MutatingAdmissionPolicy claim-finalizer.yaml, which adds the claim
// finalizer at creation. kairon-local
// reads them from here; the chart renders copies of the same files
// (charts/kairon/files/admission/, written by `make generate`).
package admission

import "embed"

// NodeServiceAccountPlaceholder stands in node-confinement.yaml for the
// username of the node agents' ServiceAccount, which only an installation
// knows; "" when agents use certificates only (kairon-local).
const NodeServiceAccountPlaceholder = "KAIRON_NODE_SERVICE_ACCOUNT"

// Policies holds *.yaml, one ValidatingAdmissionPolicySpec or
// MutatingAdmissionPolicySpec each.
//
//go:embed *.yaml
var Policies embed.FS
