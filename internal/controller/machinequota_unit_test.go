package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestQuotaReadyCondition(t *testing.T) {
	quota := &kaironv1.MachineQuota{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: "team"}, Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](2), Memory: ptr.To(resource.MustParse("1Gi"))}}}
	within := kaironv1.MachineResources{Machines: ptr.To[int32](1), CPU: ptr.To[int32](3), Memory: ptr.To(resource.MustParse("512Mi"))}
	c := quotaReadyCondition(quota, within)
	if c.Status != metav1.ConditionTrue || c.Reason != kaironv1.QuotaReasonWithinLimits || c.Message != "machines 1/2, cpu 3, memory 512Mi/1Gi" {
		t.Errorf("within limits: %+v", c)
	}
	over := kaironv1.MachineResources{Machines: ptr.To[int32](3), CPU: ptr.To[int32](3), Memory: ptr.To(resource.MustParse("2Gi"))}
	c = quotaReadyCondition(quota, over)
	if c.Status != metav1.ConditionFalse || c.Reason != kaironv1.QuotaReasonLimitExceeded ||
		c.Message != "over the limit: machines 3/2, memory 2Gi/1Gi; running Machines are kept, new ones stay Pending" {
		t.Errorf("over limits: %+v", c)
	}
}
