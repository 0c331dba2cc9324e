package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"tiervm.local/k8s/dra-driver/pkg/tiervm"
)

// Phase of a claim's VM in the checkpoint.
const (
	// PhaseCreating is written before the service is asked for the VM: a
	// driver that dies before it records the answer finds the intent on
	// restart (with a named service, repeating the PUT is idempotent).
	PhaseCreating = "creating"
	// PhasePrepared: the VM is running for the claim.
	PhasePrepared = "prepared"
	// PhaseUnpreparing is written before the VM is asked to stop for an
	// unprepare: the claim no longer holds it (the service releases a
	// stopping VM's reservation at once), and reconciliation finishes the
	// removal rather than creating the VM again. Its VM may take a while to
	// end: its process can be inside a slow kernel call (docs/scale-out.md).
	PhaseUnpreparing = "unpreparing"
)

// DeviceRef is one allocated device of a claim, as returned to the kubelet.
type DeviceRef struct {
	Request string     `json:"request"`
	Pool    string     `json:"pool"`
	Device  string     `json:"device"`
	ShareID *types.UID `json:"shareID,omitempty"`
}

// Entry is one prepared (or being prepared) claim and its VM.
type Entry struct {
	ClaimUID  types.UID `json:"claimUID"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Phase     string    `json:"phase"`
	// VMName is the name the VM is created under with a named service, and
	// the driver's own handle for it otherwise.
	VMName string `json:"vmName"`
	// VMID is the service's id of the VM (the name, or vm-N).
	VMID string `json:"vmID,omitempty"`
	// VMPid is the worker's pid when the VM was seen running: with a
	// service whose ids restart at vm-1, id and pid together say the VM
	// is still the one the driver created.
	VMPid int `json:"vmPid,omitempty"`
	// BootID is the service run the VM was created in (named services).
	BootID string `json:"bootID,omitempty"`
	// Recreated counts the times reconciliation created the VM again
	// because the service lost it.
	Recreated int         `json:"recreated,omitempty"`
	Spec      tiervm.Spec `json:"spec"`
	Devices   []DeviceRef `json:"devices"`
}

// FastMin is the claim's guaranteed fast bytes.
func (e *Entry) FastMin() int64 {
	if e.Spec.Fast == nil {
		return 0
	}
	return e.Spec.Fast.Min
}

// State is the driver's checkpoint: what it prepared.
type State struct {
	Entries map[types.UID]*Entry `json:"entries"`
}

func loadState(path string) (*State, error) {
	s := &State{Entries: map[types.UID]*Entry{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if s.Entries == nil {
		s.Entries = map[types.UID]*Entry{}
	}
	return s, nil
}

// save writes the checkpoint atomically (temporary file, fsync, rename,
// fsync of the directory).
func (s *State) save(path string) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".checkpoint-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
