// Command nvmlref answers NVML calls as NVIDIA's go-nvml mock machines do, as the oracle of
// dra-gpu's fake pynvml and of its nvml backend (tests/unit/inventory/test_nvml_oracle.py).
//
// The machines are go-nvml's own (pkg/nvml/mock/dgxa100, dgxh100, dgxh200, dgxb200: eight GPUs
// each) and two built by go-nvml's server factory from its GPU configurations (a100-80gb: eight
// gpus.A100_SXM4_80GB; a30: four gpus.A30_PCIE_24GB) with the DGX machines' versions. MIG
// profile names are go-nvlib's (pkg/nvlib/device: NewMigProfile(...).String()), the library
// NVIDIA's DRA driver, device plugin and mig-parted name profiles with.
//
// It reads one JSON request per line on stdin and writes one JSON answer per line on stdout, in
// order. Every request names a machine ("machine"); each machine is built on first use and keeps
// its state (MIG mode, instances) until a "reset". Requests ("op"):
//
//   - dump: the machine as NVML reports it: versions, and per GPU its name, brand, architecture,
//     compute capability, memory, UUID, minor number, PCI info, MIG mode, and for every GPU
//     instance profile enum 0..NVML_GPU_INSTANCE_PROFILE_COUNT the return code and info of
//     GetGpuInstanceProfileInfo, the possible placements of the profile, go-nvlib's name, and
//     the compute instance profile infos of a GPU instance of that profile.
//   - reset: the machine built again (new UUIDs: the mock draws them at random).
//   - setMigMode {gpu, mode}; getMigMode {gpu}.
//   - createGpuInstance {gpu, profile (enum), placement {start, size}}: through
//     GetGpuInstanceProfileInfo and CreateGpuInstanceWithPlacement; answers the instance.
//   - createComputeInstance {gpu, gpuInstance (id), profile (compute enum)}: through
//     GetComputeInstanceProfileInfo (shared engines) and CreateComputeInstance.
//   - listGpuInstances {gpu}: GetGpuInstances for every profile, with their compute instances.
//   - destroyComputeInstance {gpu, gpuInstance, computeInstance}; destroyGpuInstance {gpu,
//     gpuInstance}.
//   - call {gpu, method}: a device method without arguments that the mock may not implement
//     (GetMaxMigDeviceCount, GetGpuInstanceById ...): "modeled": false when the mock has no
//     answer (its generated method panics), so a test can tell "NVML refuses" from "the mock
//     does not say".
//
// Every NVML answer carries "return" (the code's name as go-nvml prints it, e.g. "SUCCESS",
// "ERROR_NOT_SUPPORTED") and "code" (its value in nvml.h). A request the oracle cannot read is
// answered {"error": "..."}.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	nvlib "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

var machines = map[string]func() *server.Server{
	"dgxa100": dgxa100.New,
	"dgxh100": dgxh100.New,
	"dgxh200": dgxh200.New,
	"dgxb200": dgxb200.New,
	// Not machines go-nvml ships: its server factory over its GPU configurations, with the
	// versions every DGX mock uses.
	"a100-80gb": func() *server.Server { return dgxa100.NewWithGPUs(gpus.Multiple(8, gpus.A100_SXM4_80GB)...) },
	"a30":       func() *server.Server { return dgxa100.NewWithGPUs(gpus.Multiple(4, gpus.A30_PCIE_24GB)...) },
}

type request struct {
	Op              string     `json:"op"`
	Machine         string     `json:"machine"`
	GPU             int        `json:"gpu"`
	Mode            int        `json:"mode"`
	Profile         int        `json:"profile"`
	Placement       *placement `json:"placement"`
	GpuInstance     uint32     `json:"gpuInstance"`
	ComputeInstance uint32     `json:"computeInstance"`
	Method          string     `json:"method"`
}

type placement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type answer map[string]any

func ret(r nvml.Return) answer {
	return answer{"return": r.Error(), "code": int(r)}
}

func (a answer) with(key string, value any) answer {
	a[key] = value
	return a
}

type oracle struct {
	servers map[string]*server.Server
}

func (o *oracle) machine(name string) (*server.Server, error) {
	if s, ok := o.servers[name]; ok {
		return s, nil
	}
	build, ok := machines[name]
	if !ok {
		names := make([]string, 0, len(machines))
		for n := range machines {
			names = append(names, n)
		}
		return nil, fmt.Errorf("no machine %q (known: %s)", name, strings.Join(names, ", "))
	}
	o.servers[name] = build()
	return o.servers[name], nil
}

func (o *oracle) device(req request) (*server.Server, *server.Device, error) {
	s, err := o.machine(req.Machine)
	if err != nil {
		return nil, nil, err
	}
	if req.GPU < 0 || req.GPU >= len(s.Devices) {
		return nil, nil, fmt.Errorf("machine %s has no GPU %d", req.Machine, req.GPU)
	}
	return s, s.Devices[req.GPU].(*server.Device), nil
}

// modeled runs a mock call; false when the mock does not implement it (moq's nil-func panic).
func modeled(call func()) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	call()
	return true
}

func cString(raw []int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func profileInfo(info nvml.GpuInstanceProfileInfo) answer {
	return answer{
		"id":                  info.Id,
		"isP2pSupported":      info.IsP2pSupported,
		"sliceCount":          info.SliceCount,
		"instanceCount":       info.InstanceCount,
		"multiprocessorCount": info.MultiprocessorCount,
		"copyEngineCount":     info.CopyEngineCount,
		"decoderCount":        info.DecoderCount,
		"encoderCount":        info.EncoderCount,
		"jpegCount":           info.JpegCount,
		"ofaCount":            info.OfaCount,
		"memorySizeMB":        info.MemorySizeMB,
	}
}

func computeProfileInfo(info nvml.ComputeInstanceProfileInfo) answer {
	return answer{
		"id":                    info.Id,
		"sliceCount":            info.SliceCount,
		"instanceCount":         info.InstanceCount,
		"multiprocessorCount":   info.MultiprocessorCount,
		"sharedCopyEngineCount": info.SharedCopyEngineCount,
		"sharedDecoderCount":    info.SharedDecoderCount,
		"sharedEncoderCount":    info.SharedEncoderCount,
		"sharedJpegCount":       info.SharedJpegCount,
		"sharedOfaCount":        info.SharedOfaCount,
	}
}

func placements(found []nvml.GpuInstancePlacement) []answer {
	out := []answer{}
	for _, p := range found {
		out = append(out, answer{"start": p.Start, "size": p.Size})
	}
	return out
}

// fullComputeProfile: the compute instance profile enum spanning a GPU instance of n slices.
func fullComputeProfile(slices uint32) int {
	switch slices {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE
	case 6:
		return nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE
	case 8:
		return nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE
	}
	return -1
}

func dumpDevice(lib nvlib.Interface, d *server.Device) answer {
	out := answer{}
	name, r := d.GetName()
	out["name"] = ret(r).with("value", name)
	brand, r := d.GetBrand()
	out["brand"] = ret(r).with("value", int(brand))
	arch, r := d.GetArchitecture()
	out["architecture"] = ret(r).with("value", int(arch))
	major, minor, r := d.GetCudaComputeCapability()
	out["cudaComputeCapability"] = ret(r).with("value", []int{major, minor})
	memory, r := d.GetMemoryInfo()
	out["memory"] = ret(r).with("value", answer{"total": memory.Total, "free": memory.Free, "used": memory.Used})
	uuid, r := d.GetUUID()
	out["uuid"] = ret(r).with("value", uuid)
	index, r := d.GetIndex()
	out["index"] = ret(r).with("value", index)
	minorNumber, r := d.GetMinorNumber()
	out["minorNumber"] = ret(r).with("value", minorNumber)
	pci, r := d.GetPciInfo()
	out["pciInfo"] = ret(r).with("value", answer{
		"busId":          cString(pci.BusId[:]),
		"busIdLegacy":    cString(pci.BusIdLegacy[:]),
		"domain":         pci.Domain,
		"bus":            pci.Bus,
		"device":         pci.Device,
		"pciDeviceId":    pci.PciDeviceId,
		"pciSubSystemId": pci.PciSubSystemId,
	})
	// Not an NVML answer: the bus id the mock keeps for DeviceGetHandleByPciBusId.
	out["mockPciBusId"] = d.PciBusID
	current, pending, r := d.GetMigMode()
	out["migMode"] = ret(r).with("value", []int{current, pending})

	profiles := []answer{}
	for enum := 0; enum <= nvml.GPU_INSTANCE_PROFILE_COUNT; enum++ {
		info, r := d.GetGpuInstanceProfileInfo(enum)
		entry := ret(r).with("profile", enum)
		profiles = append(profiles, entry)
		if r != nvml.SUCCESS {
			continue
		}
		entry["info"] = profileInfo(info)
		found, r := d.GetGpuInstancePossiblePlacements(&info)
		entry["placements"] = ret(r).with("value", placements(found))
		full := fullComputeProfile(info.SliceCount)
		if p, err := lib.NewMigProfile(enum, full, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, memory.Total); err == nil {
			entry["nvlibName"] = p.String()
		} else {
			entry["nvlibError"] = err.Error()
		}
		// A GPU instance of this profile as the mock builds one, not created on the device:
		// compute instance profiles are asked of a GPU instance in NVML.
		gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{Device: d, ProfileId: info.Id}, d.Config.MIGProfiles)
		computes := []answer{}
		for ci := 0; ci <= nvml.COMPUTE_INSTANCE_PROFILE_COUNT; ci++ {
			ciInfo, r := gi.GetComputeInstanceProfileInfo(ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			c := ret(r).with("profile", ci)
			if r == nvml.SUCCESS {
				c["info"] = computeProfileInfo(ciInfo)
			}
			computes = append(computes, c)
		}
		entry["computeInstanceProfiles"] = computes
	}
	out["gpuInstanceProfiles"] = profiles
	return out
}

func (o *oracle) dump(req request) (answer, error) {
	s, err := o.machine(req.Machine)
	if err != nil {
		return nil, err
	}
	lib := nvlib.New(s)
	out := answer{"machine": req.Machine}
	driver, r := s.SystemGetDriverVersion()
	out["driverVersion"] = ret(r).with("value", driver)
	version, r := s.SystemGetNVMLVersion()
	out["nvmlVersion"] = ret(r).with("value", version)
	cuda, r := s.SystemGetCudaDriverVersion()
	out["cudaDriverVersion"] = ret(r).with("value", cuda)
	count, r := s.DeviceGetCount()
	out["count"] = ret(r).with("value", count)
	devices := []answer{}
	for i := 0; i < count; i++ {
		handle, r := s.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			devices = append(devices, ret(r))
			continue
		}
		devices = append(devices, dumpDevice(lib, handle.(*server.Device)))
	}
	out["devices"] = devices
	_, r = s.DeviceGetHandleByIndex(count)
	out["handleBeyondCount"] = ret(r)
	return out, nil
}

func gpuInstanceAnswer(gi nvml.GpuInstance) answer {
	info, r := gi.GetInfo()
	out := ret(r)
	if r == nvml.SUCCESS {
		out["id"] = info.Id
		out["profileId"] = info.ProfileId
		out["placement"] = answer{"start": info.Placement.Start, "size": info.Placement.Size}
	}
	return out
}

func findGpuInstance(d *server.Device, id uint32) *server.GpuInstance {
	d.RLock()
	defer d.RUnlock()
	for gi := range d.GpuInstances {
		if gi.Info.Id == id {
			return gi
		}
	}
	return nil
}

func findComputeInstance(gi *server.GpuInstance, id uint32) *server.ComputeInstance {
	gi.RLock()
	defer gi.RUnlock()
	for ci := range gi.ComputeInstances {
		if ci.Info.Id == id {
			return ci
		}
	}
	return nil
}

func (o *oracle) handle(req request) (answer, error) {
	switch req.Op {
	case "dump":
		return o.dump(req)
	case "reset":
		if _, ok := machines[req.Machine]; !ok {
			_, err := o.machine(req.Machine)
			return nil, err
		}
		delete(o.servers, req.Machine)
		if _, err := o.machine(req.Machine); err != nil {
			return nil, err
		}
		return answer{"machine": req.Machine}, nil
	}
	_, d, err := o.device(req)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case "setMigMode":
		r, activation := d.SetMigMode(req.Mode)
		return ret(r).with("activation", activation.Error()), nil
	case "getMigMode":
		current, pending, r := d.GetMigMode()
		return ret(r).with("value", []int{current, pending}), nil
	case "createGpuInstance":
		info, r := d.GetGpuInstanceProfileInfo(req.Profile)
		if r != nvml.SUCCESS {
			return ret(r).with("call", "GetGpuInstanceProfileInfo"), nil
		}
		if req.Placement == nil {
			return nil, fmt.Errorf("createGpuInstance needs a placement")
		}
		where := nvml.GpuInstancePlacement{Start: req.Placement.Start, Size: req.Placement.Size}
		gi, r := d.CreateGpuInstanceWithPlacement(&info, &where)
		if r != nvml.SUCCESS {
			return ret(r).with("call", "CreateGpuInstanceWithPlacement"), nil
		}
		return gpuInstanceAnswer(gi).with("call", "CreateGpuInstanceWithPlacement"), nil
	case "createComputeInstance":
		gi := findGpuInstance(d, req.GpuInstance)
		if gi == nil {
			return nil, fmt.Errorf("GPU %d has no GPU instance %d", req.GPU, req.GpuInstance)
		}
		info, r := gi.GetComputeInstanceProfileInfo(req.Profile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r != nvml.SUCCESS {
			return ret(r).with("call", "GetComputeInstanceProfileInfo"), nil
		}
		ci, r := gi.CreateComputeInstance(&info)
		if r != nvml.SUCCESS {
			return ret(r).with("call", "CreateComputeInstance"), nil
		}
		ciInfo, r := ci.GetInfo()
		return ret(r).with("call", "CreateComputeInstance").with("id", ciInfo.Id).with("profileId", ciInfo.ProfileId), nil
	case "listGpuInstances":
		out := []answer{}
		for enum := 0; enum < nvml.GPU_INSTANCE_PROFILE_COUNT; enum++ {
			info, r := d.GetGpuInstanceProfileInfo(enum)
			if r != nvml.SUCCESS {
				continue
			}
			found, r := d.GetGpuInstances(&info)
			if r != nvml.SUCCESS {
				out = append(out, ret(r).with("profile", enum))
				continue
			}
			for _, gi := range found {
				entry := gpuInstanceAnswer(gi).with("profile", enum)
				computes := []answer{}
				for ci := 0; ci < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; ci++ {
					ciInfo, r := gi.GetComputeInstanceProfileInfo(ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
					if r != nvml.SUCCESS {
						continue
					}
					cis, _ := gi.GetComputeInstances(&ciInfo)
					for _, c := range cis {
						cInfo, r := c.GetInfo()
						computes = append(computes, ret(r).with("id", cInfo.Id).with("profileId", cInfo.ProfileId))
					}
				}
				entry["computeInstances"] = computes
				out = append(out, entry)
			}
		}
		return answer{"gpuInstances": out}, nil
	case "destroyComputeInstance":
		gi := findGpuInstance(d, req.GpuInstance)
		if gi == nil {
			return nil, fmt.Errorf("GPU %d has no GPU instance %d", req.GPU, req.GpuInstance)
		}
		ci := findComputeInstance(gi, req.ComputeInstance)
		if ci == nil {
			return nil, fmt.Errorf("GPU instance %d has no compute instance %d", req.GpuInstance, req.ComputeInstance)
		}
		return ret(ci.Destroy()), nil
	case "destroyGpuInstance":
		gi := findGpuInstance(d, req.GpuInstance)
		if gi == nil {
			return nil, fmt.Errorf("GPU %d has no GPU instance %d", req.GPU, req.GpuInstance)
		}
		return ret(gi.Destroy()), nil
	case "call":
		var out answer
		var call func()
		switch req.Method {
		case "GetMaxMigDeviceCount":
			call = func() { n, r := d.GetMaxMigDeviceCount(); out = ret(r).with("value", n) }
		case "GetMigDeviceHandleByIndex":
			call = func() { _, r := d.GetMigDeviceHandleByIndex(0); out = ret(r) }
		case "GetGpuInstanceById":
			call = func() { _, r := d.GetGpuInstanceById(int(req.GpuInstance)); out = ret(r) }
		case "GetSupportedEventTypes":
			call = func() { n, r := d.GetSupportedEventTypes(); out = ret(r).with("value", n) }
		case "IsMigDeviceHandle":
			call = func() { v, r := d.IsMigDeviceHandle(); out = ret(r).with("value", v) }
		default:
			return nil, fmt.Errorf("call: no method %q here", req.Method)
		}
		if !modeled(call) {
			return answer{"modeled": false}, nil
		}
		return out.with("modeled", true), nil
	}
	return nil, fmt.Errorf("no op %q", req.Op)
}

func main() {
	o := &oracle{servers: map[string]*server.Server{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var reply answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			reply = answer{"error": err.Error()}
		} else if a, err := o.handle(req); err != nil {
			reply = answer{"error": err.Error()}
		} else {
			reply = a
		}
		if err := out.Encode(reply); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
