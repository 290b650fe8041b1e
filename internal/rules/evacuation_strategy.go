package rules

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// StrategyAuto is the cordon evacuation strategy that chooses, for each
// Machine, live when the Machine and both nodes can migrate live and cold
// otherwise (ChooseEvacuationStrategy), as KubeVirt's LiveMigrateIfPossible.
// It is never a spec.strategy: the migration gets the strategy chosen, and
// the choice is recorded on it (kaironv1.ConditionStrategyChosen).
const StrategyAuto kaironv1.MigrationStrategy = "auto"

// liveBackends are the node backends whose agents send and receive live
// migrations (both implement backend.LiveMigrator).
var liveBackends = map[string]bool{"qemu": true, "sim": true}

// StrategyChoice is what auto chose for one Machine.
type StrategyChoice struct {
	Strategy kaironv1.MigrationStrategy
	// TargetNode is, for live, the node the migration is pinned to
	// (spec.targetNode): the one the choice was made for. Empty for cold,
	// whose target the migration controller picks as for any migration.
	TargetNode string
	// Reason is a kaironv1.StrategyReason*; Message says which and why,
	// naming the nodes.
	Reason  string
	Message string
}

// ChooseEvacuationStrategy is strategy auto's choice for Machine m on node
// source (nil when the Node is gone), given the other Kairon nodes as
// candidates, charged with what already runs or moves there (ChargeNodes).
// Live needs a Running Machine, a source whose backend migrates live, and a
// target that can receive it from source (CannotReceiveLiveFrom says why
// not); of those targets the scheduler's choice (PickNode) wins and the
// migration is pinned to it. Otherwise cold, with the target left to the
// migration controller.
func ChooseEvacuationStrategy(m *kaironv1.Machine, source *corev1.Node, candidates []*NodeInfo) StrategyChoice {
	cold := func(reason, format string, args ...any) StrategyChoice {
		return StrategyChoice{Strategy: kaironv1.MigrationCold, Reason: reason, Message: "cold: " + fmt.Sprintf(format, args...)}
	}
	switch {
	case m.Status.Phase != kaironv1.MachineRunning:
		return cold(kaironv1.StrategyReasonMachineNotLive, "machine %s is %s, not Running: only a running guest moves live",
			m.Name, phaseOrNone(m.Status.Phase))
	case source == nil:
		return cold(kaironv1.StrategyReasonSourceCannotSendLive, "node %s of machine %s is gone", m.Spec.NodeName, m.Name)
	case source.Labels[kaironv1.LabelNodeBackend] == "":
		return cold(kaironv1.StrategyReasonSourceCannotSendLive, "node %s names no backend (label %s), so nothing says it can send a live migration",
			source.Name, kaironv1.LabelNodeBackend)
	case !liveBackends[source.Labels[kaironv1.LabelNodeBackend]]:
		return cold(kaironv1.StrategyReasonSourceCannotSendLive, "node %s has backend %q, which cannot send a live migration",
			source.Name, source.Labels[kaironv1.LabelNodeBackend])
	}
	var live []*NodeInfo
	var notLive []string // the nodes that could take m cold, and why not live
	for _, n := range candidates {
		if why := CannotReceiveLiveFrom(source, n.Node); why != "" {
			if len(NodeRejections(n, m)) == 0 {
				notLive = append(notLive, n.Node.Name+" "+why)
			}
			continue
		}
		live = append(live, n)
	}
	best, whyNot := PickNode(live, m)
	if best != nil {
		return StrategyChoice{
			Strategy: kaironv1.MigrationLive, TargetNode: best.Node.Name, Reason: kaironv1.StrategyReasonLive,
			Message: fmt.Sprintf("live: machine %s runs, node %s sends it and node %s receives it live (backend %s, acceleration %s, migration endpoint %s)",
				m.Name, source.Name, best.Node.Name, source.Labels[kaironv1.LabelNodeBackend], source.Labels[kaironv1.LabelNodeAcceleration],
				best.Node.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]),
		}
	}
	if len(notLive) == 0 {
		if len(live) > 0 {
			return cold(kaironv1.StrategyReasonTargetCannotReceiveLive, "no node can take machine %s: %s", m.Name, whyNot)
		}
		return cold(kaironv1.StrategyReasonTargetCannotReceiveLive, "no other Kairon node can take machine %s", m.Name)
	}
	const listed = 5 // a message, not an inventory
	if len(notLive) > listed {
		notLive = append(notLive[:listed], fmt.Sprintf("and %d more", len(notLive)-listed))
	}
	if len(live) > 0 {
		notLive = append(notLive, "the nodes that could receive it live cannot take it: "+whyNot)
	}
	return cold(kaironv1.StrategyReasonTargetCannotReceiveLive, "no node that can take machine %s can receive it live from node %s: %s",
		m.Name, source.Name, strings.Join(notLive, "; "))
}

// CannotReceiveLiveFrom says why node target cannot receive a live
// migration from node source, or "" if it can: its agent must run the same
// backend with the same acceleration (a guest's saved device state only
// loads into the hypervisor that wrote it), and advertise a migration
// endpoint (kaironv1.AnnotationNodeMigrationEndpoint, which only exists
// while its agent runs with --migration-listen).
func CannotReceiveLiveFrom(source, target *corev1.Node) string {
	if sb, tb := source.Labels[kaironv1.LabelNodeBackend], target.Labels[kaironv1.LabelNodeBackend]; sb != tb {
		return fmt.Sprintf("has backend %q, not %q", tb, sb)
	}
	if sa, ta := source.Labels[kaironv1.LabelNodeAcceleration], target.Labels[kaironv1.LabelNodeAcceleration]; sa != ta {
		return fmt.Sprintf("has acceleration %q, not %q", ta, sa)
	}
	endpoint := target.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
	_, port, err := net.SplitHostPort(endpoint)
	if p, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || p == 0 {
		return fmt.Sprintf("has no migration endpoint (annotation %s): its agent does not accept migrations (no --migration-listen)",
			kaironv1.AnnotationNodeMigrationEndpoint)
	}
	return ""
}

// ApplyStrategyChoice gives mig, an evacuation migration not yet created,
// the strategy and target of choice, and records the choice in the
// annotations kairon-controller turns into the StrategyChosen condition.
func ApplyStrategyChoice(mig *kaironv1.MachineMigration, choice StrategyChoice) {
	mig.Spec.Strategy = choice.Strategy
	mig.Spec.TargetNode = choice.TargetNode
	if mig.Annotations == nil {
		mig.Annotations = map[string]string{}
	}
	mig.Annotations[kaironv1.AnnotationMigrationRequestedStrategy] = string(StrategyAuto)
	mig.Annotations[kaironv1.AnnotationMigrationStrategyReason] = choice.Reason
	mig.Annotations[kaironv1.AnnotationMigrationStrategyMessage] = choice.Message
}

func phaseOrNone(p kaironv1.MachinePhase) string {
	if p == "" {
		return "without a phase"
	}
	return string(p)
}
