package v1alpha1

// Names of the fence (kaironctl fence / recover, docs/guides/node-failure.md):
// an operator attests that a node is down and Kairon follows through with
// its Machines. The fence is recorded on the Node itself, in the spirit of
// Kubernetes' node.kubernetes.io/out-of-service taint.
const (
	// TaintNodeFenced is the taint kaironctl fence puts on a Node (effect
	// NoExecute, value "true") and kaironctl recover takes off. While it is
	// there the scheduler places nothing on the node and kairon-controller
	// replaces, restores or gives up the Machines that ran there.
	TaintNodeFenced = "kairon.zyvor.dev/fenced"
	// AnnotationFencedAt is on a fenced Node: when kaironctl fence put the
	// taint (RFC 3339).
	AnnotationFencedAt = "kairon.zyvor.dev/fenced-at"
	// AnnotationFencedBy is on a fenced Node: who ran kaironctl fence, as
	// the API server knows them ("" when it would not say).
	AnnotationFencedBy = "kairon.zyvor.dev/fenced-by"
	// AnnotationRecoveredAt is on a Node kaironctl recover lifted the fence
	// of (RFC 3339); it stays until the node is fenced again.
	AnnotationRecoveredAt = "kairon.zyvor.dev/recovered-at"
	// AnnotationFencedFrom is on a Machine kairon-controller restored from a
	// MachineSnapshot because its node was fenced: that node.
	AnnotationFencedFrom = "kairon.zyvor.dev/fenced-from"
	// AnnotationFenceRestoring is on a bound MachineClaim while
	// kairon-controller recreates its Machine from a snapshot under the same
	// name (the value is the snapshot): the claim is not Lost meanwhile.
	AnnotationFenceRestoring = "kairon.zyvor.dev/fence-restoring"
)
