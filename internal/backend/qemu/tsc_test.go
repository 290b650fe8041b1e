package qemu

import "testing"

func TestHostTSC(t *testing.T) {
	t.Logf("sysfs/kmsg/cpuinfo TSC: %d kHz (kmsg alone: %d)", hostTSCkHz(), tscFromKmsg())
	if hostTSCkHz() < 0 {
		t.Fatal("negative")
	}
}
