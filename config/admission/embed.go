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
