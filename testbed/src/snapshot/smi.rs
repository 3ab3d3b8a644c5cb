//! `nvidia-smi -q` text for snapshot trees.

/// What [`smi_q`] prints for one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmiGpu {
    /// PCI bus id, e.g. `00000000:18:00.0`.
    pub bus_id: String,
    /// `Minor Number` (N of `/dev/nvidiaN`).
    pub minor: u32,
    /// `Product Name`.
    pub product_name: String,
    /// `Product Brand`.
    pub product_brand: String,
    /// `Persistence Mode`.
    pub persistence_mode: String,
    /// `Addressing Mode`; `None` leaves the line out (drivers before 550).
    pub addressing_mode: Option<String>,
    /// `MIG Mode / Current` (and `Pending`).
    pub mig_mode: String,
    /// `Compute Mode`.
    pub compute_mode: String,
    /// MIG devices (GPU instances with a compute instance) printed under the GPU, each a
    /// `MIG Device` block (only with MIG on).
    pub mig_devices: u32,
    /// `Fabric / State`; `None` leaves the `Fabric` section out.
    pub fabric_state: Option<String>,
}

impl SmiGpu {
    /// GPU `index` of an HGX H200 board as a healthy host shows it: persistence on,
    /// HMM addressing, MIG off, compute mode default, fabric registration completed.
    pub fn h200(index: u32) -> Self {
        const BUSES: [&str; 8] = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"];
        SmiGpu {
            bus_id: format!("00000000:{}:00.0", BUSES[index as usize % 8].to_uppercase()),
            minor: index,
            product_name: "NVIDIA H200".to_string(),
            product_brand: "NVIDIA".to_string(),
            persistence_mode: "Enabled".to_string(),
            addressing_mode: Some("HMM".to_string()),
            mig_mode: "Disabled".to_string(),
            compute_mode: "Default".to_string(),
            mig_devices: 0,
            fabric_state: Some("Completed".to_string()),
        }
    }
}

/// `nvidia-smi -q` output of driver `version` with these GPUs, laid out as the 590
/// driver prints it for HGX H200 boards (abridged: sections the rules do not use are
/// shortened, but the structure and indentation are real).
pub fn smi_q(version: &str, gpus: &[SmiGpu]) -> String {
    let mut out = format!(
        "\n==============NVSMI LOG==============\n\n\
         Timestamp                                 : Thu Jan 15 09:41:27 2026\n\
         Driver Version                            : {version}\n\
         CUDA Version                              : 13.1\n\n\
         Attached GPUs                             : {}\n",
        gpus.len()
    );
    for (i, g) in gpus.iter().enumerate() {
        out.push_str(&smi_gpu_section(g, i));
    }
    out
}

fn smi_gpu_section(g: &SmiGpu, i: usize) -> String {
    let kv = |indent: usize, key: &str, value: &str| {
        let pad = 42usize.saturating_sub(indent + key.len());
        format!("{}{key}{} : {value}\n", " ".repeat(indent), " ".repeat(pad))
    };
    let mut s = format!("GPU {}\n", g.bus_id);
    s.push_str(&kv(4, "Product Name", &g.product_name));
    s.push_str(&kv(4, "Product Brand", &g.product_brand));
    s.push_str(&kv(4, "Product Architecture", "Hopper"));
    s.push_str(&kv(
        4,
        "Display Mode",
        "Requested functionality has been deprecated",
    ));
    s.push_str(&kv(4, "Display Attached", "No"));
    s.push_str(&kv(4, "Display Active", "Disabled"));
    s.push_str(&kv(4, "Persistence Mode", &g.persistence_mode));
    if let Some(mode) = &g.addressing_mode {
        s.push_str(&kv(4, "Addressing Mode", mode));
    }
    s.push_str("    MIG Mode\n");
    s.push_str(&kv(8, "Current", &g.mig_mode));
    s.push_str(&kv(8, "Pending", &g.mig_mode));
    // One block per MIG device, as nvidia-smi -q prints them after the MIG mode (a GI with
    // its CI; the shared attributes are left out).
    for m in 0..g.mig_devices {
        s.push_str("    MIG Device\n");
        s.push_str(&kv(8, "Index", &m.to_string()));
        s.push_str(&kv(8, "GPU Instance ID", &(m + 1).to_string()));
        s.push_str(&kv(8, "Compute Instance ID", "0"));
    }
    s.push_str(&kv(4, "Accounting Mode", "Disabled"));
    s.push_str(&kv(4, "Accounting Mode Buffer Size", "4000"));
    s.push_str("    Driver Model\n");
    s.push_str(&kv(8, "Current", "N/A"));
    s.push_str(&kv(8, "Pending", "N/A"));
    s.push_str(&kv(
        4,
        "Serial Number",
        &format!("165232401{:04}", 1187 + i),
    ));
    s.push_str(&kv(
        4,
        "GPU UUID",
        &format!("GPU-6f0c2d1e-8a4b-4c3d-9e2f-1a7b5c{:06x}", 0x3d2e10 + i),
    ));
    s.push_str(&kv(
        4,
        "GPU PDI",
        &format!("0x{:016x}", 0x5c1d_2a3b_4e00_0000u64 + i as u64),
    ));
    s.push_str(&kv(4, "Minor Number", &g.minor.to_string()));
    s.push_str(&kv(4, "VBIOS Version", "96.00.A5.00.01"));
    s.push_str(&kv(4, "MultiGPU Board", "No"));
    s.push_str(&kv(
        4,
        "Board ID",
        &format!("0x{}00", &g.bus_id[9..11].to_lowercase()),
    ));
    s.push_str(&kv(4, "Board Part Number", "692-2G530-0230-000"));
    s.push_str(&kv(4, "GPU Part Number", "2335-885-A1"));
    s.push_str(&kv(4, "FRU Part Number", "N/A"));
    s.push_str("    Platform Info\n");
    s.push_str(&kv(8, "Chassis Serial Number", "1653124018342"));
    s.push_str(&kv(8, "Slot Number", &i.to_string()));
    s.push_str(&kv(8, "Tray Index", "0"));
    s.push_str(&kv(8, "Host ID", "1"));
    s.push_str(&kv(8, "Peer Type", "Switch Connected"));
    s.push_str(&kv(8, "Module Id", &(i + 1).to_string()));
    s.push_str(&kv(
        8,
        "GPU Fabric GUID",
        &format!("0x{:016x}", 0xa0c2_f3d1_0044_1100u64 + i as u64),
    ));
    s.push_str("    Inforom Version\n");
    s.push_str(&kv(8, "Image Version", "G530.0201.00.04"));
    s.push_str(&kv(8, "OEM Object", "2.1"));
    s.push_str(&kv(8, "ECC Object", "7.16"));
    s.push_str(&kv(8, "Power Management Object", "N/A"));
    s.push_str("    GPU Operation Mode\n");
    s.push_str(&kv(8, "Current", "N/A"));
    s.push_str(&kv(8, "Pending", "N/A"));
    s.push_str(&kv(4, "GPU C2C Mode", "Disabled"));
    s.push_str("    GPU Virtualization Mode\n");
    s.push_str(&kv(8, "Virtualization Mode", "None"));
    s.push_str(&kv(8, "Host VGPU Mode", "N/A"));
    s.push_str(&kv(8, "vGPU Heterogeneous Mode", "N/A"));
    s.push_str("    GPU Reset Status\n");
    s.push_str(&kv(8, "Reset Required", "No"));
    s.push_str(&kv(8, "Drain and Reset Recommended", "No"));
    s.push_str(&kv(4, "GPU Recovery Action", "None"));
    s.push_str(&kv(4, "GSP Firmware Version", "590.48.01"));
    s.push_str("    IBMNPU\n");
    s.push_str(&kv(8, "Relaxed Ordering Mode", "N/A"));
    s.push_str("    PCI\n");
    s.push_str(&kv(8, "Bus", &format!("0x{}", &g.bus_id[9..11])));
    s.push_str(&kv(8, "Device", "0x00"));
    s.push_str(&kv(8, "Domain", "0x0000"));
    s.push_str(&kv(8, "Base Classcode", "0x3"));
    s.push_str(&kv(8, "Sub Classcode", "0x2"));
    s.push_str(&kv(8, "Device Id", "0x233510DE"));
    s.push_str(&kv(8, "Bus Id", &g.bus_id));
    s.push_str(&kv(8, "Sub System Id", "0x18BE10DE"));
    s.push_str("        GPU Link Info\n");
    s.push_str("            PCIe Generation\n");
    s.push_str(&kv(16, "Max", "5"));
    s.push_str(&kv(16, "Current", "5"));
    s.push_str(&kv(16, "Device Current", "5"));
    s.push_str(&kv(16, "Device Max", "5"));
    s.push_str(&kv(16, "Host Max", "5"));
    s.push_str("            Link Width\n");
    s.push_str(&kv(16, "Max", "16x"));
    s.push_str(&kv(16, "Current", "16x"));
    s.push_str("        Bridge Chip\n");
    s.push_str(&kv(12, "Type", "N/A"));
    s.push_str(&kv(12, "Firmware", "N/A"));
    s.push_str(&kv(8, "Replays Since Reset", "0"));
    s.push_str(&kv(8, "Replay Number Rollovers", "0"));
    s.push_str(&kv(8, "Tx Throughput", "0 KB/s"));
    s.push_str(&kv(8, "Rx Throughput", "0 KB/s"));
    s.push_str(&kv(8, "Atomic Caps Outbound", "N/A"));
    s.push_str(&kv(8, "Atomic Caps Inbound", "N/A"));
    s.push_str(&kv(4, "Fan Speed", "N/A"));
    s.push_str(&kv(4, "Performance State", "P0"));
    s.push_str("    Clocks Event Reasons\n");
    s.push_str(&kv(8, "Idle", "Active"));
    s.push_str(&kv(8, "Applications Clocks Setting", "Not Active"));
    s.push_str(&kv(8, "SW Power Cap", "Not Active"));
    s.push_str(&kv(8, "HW Slowdown", "Not Active"));
    s.push_str(&kv(8, "Sync Boost", "Not Active"));
    s.push_str(&kv(8, "SW Thermal Slowdown", "Not Active"));
    s.push_str(&kv(4, "Sparse Operation Mode", "N/A"));
    s.push_str("    FB Memory Usage\n");
    s.push_str(&kv(8, "Total", "143771 MiB"));
    s.push_str(&kv(8, "Reserved", "607 MiB"));
    s.push_str(&kv(8, "Used", "1 MiB"));
    s.push_str(&kv(8, "Free", "143163 MiB"));
    s.push_str("    BAR1 Memory Usage\n");
    s.push_str(&kv(8, "Total", "262144 MiB"));
    s.push_str(&kv(8, "Used", "1 MiB"));
    s.push_str(&kv(8, "Free", "262143 MiB"));
    s.push_str("    Conf Compute Protected Memory Usage\n");
    s.push_str(&kv(8, "Total", "0 MiB"));
    s.push_str(&kv(8, "Used", "0 MiB"));
    s.push_str(&kv(8, "Free", "0 MiB"));
    s.push_str(&kv(4, "Compute Mode", &g.compute_mode));
    s.push_str("    Utilization\n");
    s.push_str(&kv(8, "GPU", "0 %"));
    s.push_str(&kv(8, "Memory", "0 %"));
    s.push_str(&kv(8, "Encoder", "0 %"));
    s.push_str(&kv(8, "Decoder", "0 %"));
    s.push_str("    ECC Mode\n");
    s.push_str(&kv(8, "Current", "Enabled"));
    s.push_str(&kv(8, "Pending", "Enabled"));
    s.push_str("    ECC Errors\n");
    s.push_str("        Volatile\n");
    s.push_str(&kv(12, "SRAM Correctable", "0"));
    s.push_str(&kv(12, "SRAM Uncorrectable Parity", "0"));
    s.push_str(&kv(12, "SRAM Uncorrectable SEC-DED", "0"));
    s.push_str(&kv(12, "DRAM Correctable", "0"));
    s.push_str(&kv(12, "DRAM Uncorrectable", "0"));
    s.push_str("    Remapped Rows\n");
    s.push_str(&kv(8, "Correctable Error", "0"));
    s.push_str(&kv(8, "Uncorrectable Error", "0"));
    s.push_str(&kv(8, "Pending", "No"));
    s.push_str(&kv(8, "Remapping Failure Occurred", "No"));
    s.push_str("    Temperature\n");
    s.push_str(&kv(8, "GPU Current Temp", "31 C"));
    s.push_str(&kv(8, "GPU T.Limit Temp", "56 C"));
    s.push_str(&kv(8, "GPU Shutdown Temp", "92 C"));
    s.push_str(&kv(8, "GPU Slowdown Temp", "89 C"));
    s.push_str(&kv(8, "Memory Current Temp", "38 C"));
    s.push_str("    GPU Power Readings\n");
    s.push_str(&kv(8, "Average Power Draw", "74.10 W"));
    s.push_str(&kv(8, "Instantaneous Power Draw", "74.52 W"));
    s.push_str(&kv(8, "Current Power Limit", "700.00 W"));
    s.push_str(&kv(8, "Max Power Limit", "700.00 W"));
    s.push_str("    Clocks\n");
    s.push_str(&kv(8, "Graphics", "345 MHz"));
    s.push_str(&kv(8, "SM", "345 MHz"));
    s.push_str(&kv(8, "Memory", "3201 MHz"));
    s.push_str(&kv(8, "Video", "765 MHz"));
    s.push_str("    Max Clocks\n");
    s.push_str(&kv(8, "Graphics", "1980 MHz"));
    s.push_str(&kv(8, "SM", "1980 MHz"));
    s.push_str(&kv(8, "Memory", "3201 MHz"));
    s.push_str(&kv(8, "Video", "1545 MHz"));
    s.push_str("    Voltage\n");
    s.push_str(&kv(8, "Graphics", "670.000 mV"));
    if let Some(state) = &g.fabric_state {
        let done = state == "Completed";
        s.push_str("    Fabric\n");
        s.push_str(&kv(8, "State", state));
        s.push_str(&kv(8, "Status", if done { "Success" } else { "N/A" }));
        s.push_str(&kv(8, "CliqueId", if done { "32766" } else { "N/A" }));
        s.push_str(&kv(
            8,
            "ClusterUUID",
            if done {
                "00000000-0000-0000-0000-000000000000"
            } else {
                "N/A"
            },
        ));
        s.push_str("        Health\n");
        s.push_str(&kv(12, "Bandwidth", if done { "Full" } else { "N/A" }));
        s.push_str(&kv(12, "Route Recovery in progress", "False"));
        s.push_str(&kv(12, "Route Unhealthy", "False"));
        s.push_str(&kv(12, "Access Timeout Recovery", "False"));
    }
    s.push_str(&kv(4, "Processes", "None"));
    s.push('\n');
    s
}
