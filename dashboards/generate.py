#!/usr/bin/env python3
"""Writes the Grafana dashboards in this directory (uvmwatch-*.json).

The JSON files are generated: edit this script and run it (`python3 dashboards/generate.py`),
never the JSON by hand. `cargo test -p uvmwatch --test prometheus` checks that the files are
what this script prints, their structure (uids, variables, units, descriptions, metric
names) and, against a real Prometheus scraping a real agent, that every query parses and
returns data. See dashboards/README.md and docs/dashboards.md.

Only the Python standard library is used.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The selector every uvmwatch query carries: the dashboard's job, node and instance.
# `hostname` is the target label the deployment sets (docs/deployment.md); series without it
# still match the variables' "All" value (.*).
SEL = 'job=~"$job", hostname=~"$node", instance=~"$instance"'
DS = {"type": "prometheus", "uid": "${datasource}"}
RUNBOOK_BASE = "https://github.com/uvmwatch/uvmwatch/blob/main/docs/runbooks/"
# Required on their backend (docs/probes.md#backends): a probe counts only on the backend
# its agent chose (`uvmwatch_probe_backend_info`); the other backend's are on standby.
REQUIRED_PROBES = (
    "fentry:__x64_sys_ioctl|fexit:__x64_sys_ioctl|fentry:chrdev_open|fexit:chrdev_open|"
    "fexit:do_filp_open|"
    "syscalls:sys_enter_openat|syscalls:sys_exit_openat|"
    "syscalls:sys_enter_ioctl|syscalls:sys_exit_ioctl"
)


def sel(extra=""):
    return "{" + SEL + (", " + extra if extra else "") + "}"


S_NOT_SUCCESS = sel('result!="CUDA_SUCCESS"')
S_OPEN_FAILED = sel('result!="success"')
S_IOCTL_FAILED = sel('result!~"NV_OK|OK"')
S_CUINIT = sel('call="cuInit"')
S_NOT_CUINIT = sel('call!="cuInit"')
S_IO_FAILED = sel('node=~"$device", ioctl=~"$ioctl", result!~"NV_OK|OK"')
S_REQUIRED = sel('probe=~"' + REQUIRED_PROBES + '"')


def target(expr, legend="", ref="A", instant=False, fmt=None):
    t = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend or "__auto"}
    if instant:
        t["instant"] = True
        t["range"] = False
    else:
        t["range"] = True
    if fmt:
        t["format"] = fmt
    return t


class Layout:
    """Places panels left to right on a 24-column grid, wrapping rows."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1
        self.panels = []

    def add(self, panel, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        panel["id"] = self.next_id
        self.next_id += 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        self.panels.append(
            {
                "id": self.next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            }
        )
        self.next_id += 1
        self.y += 1


def field_config(unit, decimals=None, mappings=None, thresholds=None, links=None, min0=False):
    d = {"unit": unit}
    if decimals is not None:
        d["decimals"] = decimals
    if mappings:
        d["mappings"] = mappings
    d["thresholds"] = thresholds or {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}],
    }
    if links:
        d["links"] = links
    if min0:
        d["min"] = 0
    return {"defaults": d, "overrides": []}


def red_above(v):
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, {"color": "red", "value": v}],
    }


def stat(title, desc, expr, unit="none", thresholds=None, mappings=None):
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, instant=True)],
        "fieldConfig": field_config(unit, thresholds=thresholds, mappings=mappings),
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    }


def timeseries(title, desc, targets, unit, stack=False, min0=True):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    fc = field_config(unit, min0=min0)
    fc["defaults"]["custom"] = custom
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": fc,
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                       "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def table(title, desc, targets, unit="none", links=None, organize=None, mappings=None):
    fc = field_config(unit, links=links, mappings=mappings)
    transformations = [{"id": "merge", "options": {}}]
    if organize:
        transformations.append({"id": "organize", "options": organize})
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": fc,
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": transformations,
    }


def heatmap(title, desc, expr, yunit):
    fc = field_config("short")
    fc["defaults"]["custom"] = {"scaleDistribution": {"type": "linear"}}
    return {
        "type": "heatmap",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, legend="{{le}}", fmt="heatmap")],
        "fieldConfig": fc,
        "options": {
            "calculate": False,
            "yAxis": {"unit": yunit, "axisPlacement": "left"},
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5},
            "tooltip": {"mode": "single", "yHistogram": True},
            "rowsFrame": {"layout": "auto"},
            "legend": {"show": True},
        },
    }


def variables(extra=()):
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "description": "Prometheus that scrapes the uvmwatch agents.",
        },
        query_var(
            "job",
            "Job",
            "label_values(uvmwatch_build_info, job)",
            "Scrape job(s) of the uvmwatch agents (uvmwatch in the shipped configs).",
            all_value=".+",
        ),
        query_var(
            "node",
            "Node",
            "label_values(uvmwatch_build_info{job=~\"$job\"}, hostname)",
            "Host or Kubernetes node (target label hostname, set by the scrape config; "
            "All also matches agents scraped without it).",
            all_value=".*",
        ),
        query_var(
            "instance",
            "Instance",
            "label_values(uvmwatch_build_info{job=~\"$job\", hostname=~\"$node\"}, instance)",
            "Agent endpoint(s) (host:port).",
            all_value=".+",
        ),
        *extra,
    ]


def query_var(name, label, query, desc, all_value=".*"):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": all_value,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "regex": "",
        "description": desc,
    }


def annotations():
    return [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        prom_annotation(
            "Stalls",
            "red",
            # A stall in progress (gauge) or one counted since the last step (a stall
            # shorter than the scrape interval is only seen by the counter).
            f"max by (job, instance, call) (uvmwatch_stalled_calls{sel()}) > 0\n"
            f"or\nsum by (job, instance, call) (changes(uvmwatch_stalls_total{sel()}[$__interval])) > 0",
            "stall: {{call}}",
            "{{call}} past its stall threshold on {{instance}}",
            "call,instance",
        ),
        prom_annotation(
            "Diagnoses",
            "orange",
            f"max by (job, instance, rule, severity) (uvmwatch_diagnosis{sel()}) == 1",
            "diagnosis: {{rule}} ({{severity}})",
            "uvmwatch rule {{rule}} active on {{instance}}; runbook: "
            + RUNBOOK_BASE
            + "{{rule}}.md",
            "rule,severity,instance",
        ),
    ]


def prom_annotation(name, color, expr, title, text, tags):
    return {
        "name": name,
        "datasource": DS,
        "enable": True,
        "hide": False,
        "iconColor": color,
        "expr": expr,
        "step": "30s",
        "titleFormat": title,
        "textFormat": text,
        "tagKeys": tags,
        "useValueForTime": False,
        "target": {"expr": expr, "refId": "Anno", "datasource": DS},
    }


def dashboard(uid, title, desc, layout, extra_vars=()):
    return {
        "__comment": "Generated by dashboards/generate.py; do not edit by hand.",
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["uvmwatch", "gpu", "cuda"],
        "editable": True,
        "graphTooltip": 1,
        "id": None,
        "version": 1,
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [
            {
                "title": "uvmwatch",
                "type": "dashboards",
                "tags": ["uvmwatch"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "annotations": {"list": annotations()},
        "templating": {"list": variables(extra_vars)},
        "panels": layout.panels,
    }


def diag_links():
    return [
        {
            "title": "Runbook for ${__data.fields.rule}",
            "url": RUNBOOK_BASE + "${__data.fields.rule}.md",
            "targetBlank": True,
        }
    ]


SEVERITY_COLORS = [
    {"type": "value", "options": {
        "critical": {"color": "red", "index": 0},
        "warning": {"color": "orange", "index": 1},
        "info": {"color": "blue", "index": 2},
    }}
]


def active_diagnoses_table():
    return table(
        "Active diagnoses",
        "uvmwatch_diagnosis findings that are active now (value 1), by agent, rule and "
        "severity. A finding from a stall or failure stays active for --diagnosis-ttl (10m "
        "by default); one from the host's state while it holds. Click a row for the rule's "
        "runbook.",
        [target(f"max by (instance, rule, severity) (uvmwatch_diagnosis{sel()}) == 1",
                instant=True, fmt="table")],
        links=diag_links(),
        organize={"excludeByName": {"Time": True, "Value": True}},
        mappings=SEVERITY_COLORS,
    )


# Fleet outliers: the statistics of the uvmwatch-fleet rule group
# (deploy/prometheus/uvmwatch-alerts.yaml, docs/alerts.md#fleet-outliers), computed here
# from the agents' own series so that the panels work without the rules loaded. The fleet
# is the selected agents of each job (All: every agent).
FLEET_K = 3
FLEET_P95 = ("(histogram_quantile(0.95, sum by (job, instance, hostname, le) "
             f"(rate(uvmwatch_cuinit_duration_seconds_bucket{sel()}[1h]))) >= 0)")
_CALLS_WITH_RESULT = sel('result!~"thread_exited|unknown"')
_CALLS_FAILED = sel('result!~"CUDA_SUCCESS|thread_exited|unknown"')
FLEET_FAILURE_RATIO = (
    f"((sum by (job, instance, hostname) (increase(uvmwatch_cuinit_calls_total{_CALLS_FAILED}[1h])) "
    f"or 0 * sum by (job, instance, hostname) (increase(uvmwatch_cuinit_calls_total{_CALLS_WITH_RESULT}[1h]))) "
    f"/ (sum by (job, instance, hostname) (increase(uvmwatch_cuinit_calls_total{_CALLS_WITH_RESULT}[1h])) > 0))"
)


def fleet_median(v):
    return f"quantile by (job) (0.5, {v})"


def fleet_mad(v):
    return f"quantile by (job) (0.5, abs({v} - on (job) group_left () {fleet_median(v)}))"


def fleet_panel(title, desc, per_node, unit, margin):
    """Per-node values, the fleet median, median + k MAD and the alert threshold:
    median + margin(k, mad, m), a PromQL expression for the largest of k MAD and the
    alert's floors (m: the median, mad: the MAD, both PromQL expressions)."""
    m = fleet_median(per_node)
    mad = fleet_mad(per_node)
    panel = timeseries(title, desc, [
        target(per_node, "{{instance}}", "A"),
        target(m, "fleet median ({{job}})", "B"),
        target(f"{m} + {FLEET_K} * {mad}", f"median + {FLEET_K} MAD ({{{{job}}}})", "C"),
        target(f"{m} + {margin(FLEET_K, mad, m)}", "alert threshold ({{job}})", "D"),
    ], unit)
    dashed = [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
              {"id": "custom.fillOpacity", "value": 0}]
    panel["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": dashed}
        for ref in ("B", "C", "D")
    ]
    return panel


def fleet():
    L = Layout()
    L.row("Fleet")
    L.add(stat("Agents up", "Agents whose last scrape succeeded (Prometheus' up == 1).",
               f"sum(up{sel()})"), 4, 4)
    L.add(stat("Agents down", "Agents Prometheus fails to scrape (up == 0): CUDA start-up "
               "on those hosts is not watched.",
               f"count(up{sel()} == 0) or vector(0)", thresholds=red_above(1)), 4, 4)
    L.add(stat("cuInit in flight", "cuInit calls running now, summed over the selected agents.",
               f"sum(uvmwatch_cuinit_in_flight{sel()})"), 4, 4)
    L.add(stat("Calls stalled now", "cuInit and driver calls past their stall threshold "
               "(--cuinit-stall, --ioctl-stall) now, summed over the selected agents.",
               f"sum(uvmwatch_stalled_calls{sel()})", thresholds=red_above(1)), 4, 4)
    L.add(stat("cuInit failures since agent start", "cuInit calls that returned an error "
               "(anything but CUDA_SUCCESS; thread_exited counts too), summed since each "
               "agent started. The rate panels below show when.",
               f"sum(uvmwatch_cuinit_calls_total{S_NOT_SUCCESS}) or vector(0)",
               thresholds=red_above(1)), 4, 4)
    L.add(stat("Active diagnoses", "uvmwatch_diagnosis findings active now (any severity).",
               f"count(uvmwatch_diagnosis{sel()} == 1) or vector(0)",
               thresholds=red_above(1)), 4, 4)
    L.add(table("Agents", "One row per agent: its version and kernel (uvmwatch_build_info), "
                "and the host it runs on.",
                [target(f"uvmwatch_build_info{sel()}", instant=True, fmt="table")],
                organize={"excludeByName": {"Time": True, "Value": True, "__name__": True}}),
          12, 8)
    L.add(active_diagnoses_table(), 12, 8)
    L.row("Activity")
    L.add(timeseries("cuInit calls by result", "cuInit calls that ended, per second, by "
                     "CUresult name over the selected agents. A result seen for the first "
                     "time shows from its second occurrence (rate needs two samples); the "
                     "tables in CUDA init health count every call.",
                     [target(f"sum by (result) (rate(uvmwatch_cuinit_calls_total{sel()}[$__rate_interval]))",
                             "{{result}}")], "ops"), 12, 8)
    L.add(timeseries("Stalled calls by agent", "Calls past their stall threshold now, by "
                     "agent and call (cuInit or the driver ioctl name).",
                     [target(f"sum by (instance, call) (uvmwatch_stalled_calls{sel()})",
                             "{{instance}} {{call}}")], "none"), 12, 8)
    L.add(timeseries("Failed device opens", "openat() of NVIDIA device nodes that failed, "
                     "per second, by agent, node and errno (EPERM/EACCES: permission; "
                     "ENOENT/ENXIO/ENODEV: node or module missing).",
                     [target(f"sum by (instance, node, result) (rate(uvmwatch_device_opens_total{S_OPEN_FAILED}[$__rate_interval]))",
                             "{{instance}} /dev/{{node}} {{result}}")], "ops"), 12, 8)
    L.add(timeseries("Failed driver ioctls", "Driver ioctls on NVIDIA nodes that did not "
                     "return NV_OK/OK, per second, by agent and result (rmStatus or errno "
                     "name).",
                     [target(f"sum by (instance, result) (rate(uvmwatch_driver_ioctl_calls_total{S_IOCTL_FAILED}[$__rate_interval]))",
                             "{{instance}} {{result}}")], "ops"), 12, 8)
    L.row("Nodes against the fleet")
    L.add(fleet_panel(
        "cuInit p95 by node against the fleet (1h)",
        "p95 of cuInit duration per agent over the last hour (fixed 1h window, as the "
        "alerts), the median of the agents' p95 (the fleet: the selected agents of each "
        "job, all of them with All), median + 3 MAD (median absolute deviation) and the "
        "threshold of UvmwatchNodeCuInitSlowerThanFleet: the largest of median + 3 MAD, "
        "2 x the median and median + 1 s. A node above it for 15 minutes alerts when the "
        "job has at least 5 nodes with cuInit calls in the hour. Runbook: "
        + RUNBOOK_BASE + "cuinit-fleet-outlier.md",
        FLEET_P95, "s",
        lambda k, mad, m: f"clamp_min(({k} * {mad} > {m}) or {m}, 1)"), 12, 9)
    L.add(fleet_panel(
        "cuInit failure ratio by node against the fleet (1h)",
        "Share of cuInit calls per agent over the last hour that failed (results other "
        "than CUDA_SUCCESS, thread_exited and unknown, over the calls with a result; agents "
        "without calls in the hour are left out), the median over the fleet (the selected "
        "agents of each job), median + 3 MAD and the threshold of "
        "UvmwatchNodeCuInitFailingMoreThanFleet: the larger of median + 3 MAD and median + "
        "5 percentage points; it alerts after 15 minutes with at least 5 nodes. Runbook: "
        + RUNBOOK_BASE + "cuinit-fleet-outlier.md",
        FLEET_FAILURE_RATIO, "percentunit",
        lambda k, mad, m: f"clamp_min({k} * {mad}, 0.05)"), 12, 9)
    return dashboard("uvmwatch-fleet", "uvmwatch / Fleet overview",
                     "Every uvmwatch agent: which are up, cuInit calls in flight, stalled or "
                     "failing, active diagnoses, and the nodes whose cuInit latency or "
                     "failure ratio stands out from the fleet.", L)


def cuinit():
    L = Layout()
    L.row("Now")
    L.add(stat("cuInit in flight", "cuInit calls running now.",
               f"sum(uvmwatch_cuinit_in_flight{sel()})"), 6, 4)
    L.add(stat("cuInit stalled now", "cuInit calls running for longer than --cuinit-stall "
               "(20s by default) now. The agent's event=\"stall\" log record says where "
               "each one waits.",
               f"sum(uvmwatch_stalled_calls{S_CUINIT})",
               thresholds=red_above(1)), 6, 4)
    L.add(stat("cuInit p99 latency", "99th percentile of cuInit duration over the "
               "dashboard's time range (calls that returned).",
               f"histogram_quantile(0.99, sum by (le) (increase(uvmwatch_cuinit_duration_seconds_bucket{sel()}[$__range])))",
               unit="s"), 6, 4)
    L.add(stat("cuInit failure ratio", "Share of cuInit calls in the time range that did "
               "not return CUDA_SUCCESS (from calls counted at least twice per result; see "
               "the table below for every call).",
               f"sum(increase(uvmwatch_cuinit_calls_total{S_NOT_SUCCESS}[$__range])) "
               f"/ sum(increase(uvmwatch_cuinit_calls_total{sel()}[$__range]))",
               unit="percentunit", thresholds=red_above(0.01)), 6, 4)
    L.row("Calls and results")
    L.add(timeseries("cuInit calls by result", "cuInit calls that ended, per second, by "
                     "CUresult name (thread_exited: the thread died inside the call).",
                     [target(f"sum by (result) (rate(uvmwatch_cuinit_calls_total{sel()}[$__rate_interval]))",
                             "{{result}}")], "ops", stack=True), 12, 8)
    L.add(table("cuInit results since agent start", "Every cuInit call counted by each "
                "agent since it started, by result. Unlike the rate panels this includes a "
                "result seen only once.",
                [target(f"sum by (instance, result) (uvmwatch_cuinit_calls_total{sel()})",
                        instant=True, fmt="table")],
                organize={"excludeByName": {"Time": True},
                          "renameByName": {"Value": "calls"}}), 12, 8)
    L.row("Latency")
    L.add(timeseries("cuInit latency quantiles", "p50, p90 and p99 of cuInit duration "
                     "(histogram uvmwatch_cuinit_duration_seconds, 1 ms to 600 s buckets).",
                     [target(f"histogram_quantile({q}, sum by (le) (rate(uvmwatch_cuinit_duration_seconds_bucket{sel()}[$__rate_interval])))",
                             f"p{int(q * 100)}", ref)
                      for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))], "s"), 12, 8)
    L.add(timeseries("cuInit mean duration by agent", "Mean cuInit duration per agent "
                     "(rate of the histogram's sum over rate of its count).",
                     [target(f"sum by (instance) (rate(uvmwatch_cuinit_duration_seconds_sum{sel()}[$__rate_interval])) "
                             f"/ sum by (instance) (rate(uvmwatch_cuinit_duration_seconds_count{sel()}[$__rate_interval]))",
                             "{{instance}}")], "s"), 12, 8)
    L.add(heatmap("cuInit duration distribution", "How many cuInit calls ended in each "
                  "duration bucket per interval.",
                  f"sum by (le) (increase(uvmwatch_cuinit_duration_seconds_bucket{sel()}[$__rate_interval]))",
                  "s"), 24, 8)
    L.row("Stalls, opens and diagnoses")
    L.add(timeseries("Stalled cuInit calls", "cuInit calls past --cuinit-stall, by agent. "
                     "Stall regions are also marked on every panel (Stalls annotation).",
                     [target(f"sum by (instance) (uvmwatch_stalled_calls{S_CUINIT})",
                             "{{instance}}")], "none"), 12, 8)
    L.add(timeseries("Stalls counted", "Calls that crossed their stall threshold, per "
                     "interval, by call.",
                     [target(f"sum by (call) (increase(uvmwatch_stalls_total{sel()}[$__rate_interval]))",
                             "{{call}}")], "none"), 12, 8)
    L.add(timeseries("Device opens by result", "openat() of NVIDIA device nodes per second, "
                     "by node and result (success or errno).",
                     [target(f"sum by (node, result) (rate(uvmwatch_device_opens_total{sel()}[$__rate_interval]))",
                             "/dev/{{node}} {{result}}")], "ops"), 12, 8)
    L.add(table("Failed device opens since agent start", "Every failed open of an NVIDIA "
                "node counted since each agent started, by node and errno.",
                [target(f"sum by (instance, node, result) (uvmwatch_device_opens_total{S_OPEN_FAILED})",
                        instant=True, fmt="table")],
                organize={"excludeByName": {"Time": True},
                          "renameByName": {"Value": "opens"}}), 12, 8)
    L.add(active_diagnoses_table(), 24, 8)
    return dashboard("uvmwatch-cuinit", "uvmwatch / CUDA init health",
                     "cuInit calls: results, latency, stalls, device opens and the "
                     "diagnoses they led to.", L)


def ioctls():
    io = sel('node=~"$device", ioctl=~"$ioctl"')
    L = Layout()
    L.row("Rates")
    L.add(timeseries("Ioctls by device node", "Driver ioctls per second on each NVIDIA "
                     "device node.",
                     [target(f"sum by (node) (rate(uvmwatch_driver_ioctl_calls_total{io}[$__rate_interval]))",
                             "/dev/{{node}}")], "ops", stack=True), 12, 8)
    L.add(timeseries("Top ioctls", "The ten most frequent driver ioctls (names from the "
                     "driver headers; unknown for others).",
                     [target(f"topk(10, sum by (node, ioctl) (rate(uvmwatch_driver_ioctl_calls_total{io}[$__rate_interval])))",
                             "{{ioctl}} /dev/{{node}}")], "ops"), 12, 8)
    L.add(timeseries("Failed ioctls", "Ioctls that did not return NV_OK or OK, per second, "
                     "by ioctl and result: NV_ERR_* from the parameters' rmStatus, an errno "
                     "name when the syscall failed, PARAMS_UNREADABLE. A result seen once "
                     "shows in the table beside.",
                     [target(f"sum by (node, ioctl, result) (rate(uvmwatch_driver_ioctl_calls_total{S_IO_FAILED}[$__rate_interval]))",
                             "{{ioctl}} {{result}}")], "ops"), 12, 8)
    L.add(table("Failed ioctls since agent start", "Every failed driver ioctl counted "
                "since each agent started, by node, ioctl and result.",
                [target(f"sum by (instance, node, ioctl, result) (uvmwatch_driver_ioctl_calls_total{S_IO_FAILED})",
                        instant=True, fmt="table")],
                organize={"excludeByName": {"Time": True},
                          "renameByName": {"Value": "calls"}}), 12, 8)
    L.row("Latency")
    for q in (0.5, 0.99):
        L.add(timeseries(f"Ioctl latency p{int(q * 100)} by ioctl",
                         f"{int(q * 100)}th percentile of driver ioctl latency, by ioctl "
                         "(kernel log2 buckets: about 1 µs to 137 s, so a quantile is "
                         "accurate to a factor of two).",
                         [target(f"histogram_quantile({q}, sum by (le, ioctl) (rate(uvmwatch_driver_ioctl_duration_seconds_bucket{io}[$__rate_interval])))",
                                 "{{ioctl}}")], "s"), 12, 8)
    L.add(heatmap("Ioctl latency distribution", "Driver ioctls per latency bucket and "
                  "interval, over the selected nodes and ioctls.",
                  f"sum by (le) (increase(uvmwatch_driver_ioctl_duration_seconds_bucket{io}[$__rate_interval]))",
                  "s"), 24, 8)
    L.row("Stalls and tracked processes")
    L.add(timeseries("Stalled driver calls", "Driver ioctls running for longer than "
                     "--ioctl-stall (5s by default) now, by agent and ioctl.",
                     [target(f"sum by (instance, call) (uvmwatch_stalled_calls{S_NOT_CUINIT})",
                             "{{instance}} {{call}}")], "none"), 12, 8)
    L.add(timeseries("Tracked processes", "Processes whose ioctls the kernel side looks at "
                     "(NVIDIA users and their children), by agent.",
                     [target(f"sum by (instance) (uvmwatch_tracked_processes{sel()})",
                             "{{instance}}")], "none"), 12, 8)
    extra = (
        query_var("device", "Device node",
                  "label_values(uvmwatch_driver_ioctl_calls_total{job=~\"$job\", instance=~\"$instance\"}, node)",
                  "NVIDIA device node(s) (label node: nvidiactl, nvidia<N>, nvidia-uvm, "
                  "nvidia-uvm-tools).", all_value=".+"),
        query_var("ioctl", "Ioctl",
                  "label_values(uvmwatch_driver_ioctl_calls_total{job=~\"$job\", instance=~\"$instance\", node=~\"$device\"}, ioctl)",
                  "Driver ioctl name(s).", all_value=".+"),
    )
    return dashboard("uvmwatch-ioctls", "uvmwatch / Driver ioctls",
                     "Driver ioctls on NVIDIA device nodes: rates, results, latency and "
                     "stalls.", L, extra)


def agent():
    probe_map = [{"type": "value", "options": {
        "1": {"text": "attached", "color": "green", "index": 0},
        "0": {"text": "not attached", "color": "red", "index": 1},
    }}]
    L = Layout()
    L.row("Scrapes")
    L.add(timeseries("Scrape up", "1 when Prometheus' last scrape of the agent succeeded.",
                     [target(f"up{sel()}", "{{instance}}")], "none"), 8, 7)
    L.add(timeseries("Scrape duration", "How long Prometheus took to scrape /metrics (the "
                     "agent reads its kernel maps at each scrape).",
                     [target(f"scrape_duration_seconds{sel()}", "{{instance}}")], "s"), 8, 7)
    L.add(timeseries("Samples per scrape", "Samples in each scrape of the agent: grows with "
                     "the distinct ioctl names and results seen.",
                     [target(f"scrape_samples_scraped{sel()}", "{{instance}}")], "short"), 8, 7)
    L.row("Probes")
    L.add(stat("Required probes not attached", "Required probes of the backend each agent "
               "chose (the open and ioctl trampolines, or tracepoints) not attached, over the "
               "selected agents: without them an agent sees no device opens or driver calls. "
               "`uvmwatch probes` on the host says why.",
               f"count((uvmwatch_probe_attached{S_REQUIRED} == 0) and on (job, instance, "
               f"backend) uvmwatch_probe_backend_info{sel()}) or vector(0)",
               thresholds=red_above(1)), 6, 8)
    L.add(stat("libcuda files probed", "Distinct libcuda files (device, inode) with cuInit "
               "probes attached, summed over the selected agents. 0 until a libcuda is "
               "found.", f"sum(uvmwatch_libcuda_targets{sel()})"), 6, 8)
    L.add(table("Probe states", "uvmwatch_probe_attached per agent and probe (docs/probes.md "
                "lists which are required).",
                [target(f"uvmwatch_probe_attached{sel()}", instant=True, fmt="table")],
                organize={"excludeByName": {"Time": True, "__name__": True, "job": True},
                          "renameByName": {"Value": "attached"}},
                mappings=probe_map), 12, 8)
    L.row("Losses and kernel state")
    L.add(timeseries("Events dropped", "Event records lost per second (kernel ring buffer "
                     "full, or undecodable). Kernel-side counters stay exact.",
                     [target(f"sum by (instance) (rate(uvmwatch_events_dropped_total{sel()}[$__rate_interval]))",
                             "{{instance}}")], "eps"), 8, 7)
    L.add(timeseries("Kernel map full", "Calls, processes, opens or aggregate series per "
                     "second that could not be stored because a kernel map was full, by map; "
                     "and opens not followed to their exit (their start recycled by the "
                     "per-thread map of opens, past 16384 threads, or begun before the agent).",
                     [target(f"sum by (instance, map) (rate(uvmwatch_kernel_map_full_total{sel()}[$__rate_interval]))",
                             "{{instance}} {{map}}"),
                      target(f"sum by (instance) (rate(uvmwatch_opens_unfollowed_total{sel()}[$__rate_interval]))",
                             "{{instance}} opens unfollowed")], "ops"), 8, 7)
    L.add(timeseries("Tracked processes", "Processes whose ioctls the kernel side looks at.",
                     [target(f"uvmwatch_tracked_processes{sel()}", "{{instance}}")], "none"), 8, 7)
    L.add(table("Versions", "Agent version and kernel release per agent "
                "(uvmwatch_build_info).",
                [target(f"uvmwatch_build_info{sel()}", instant=True, fmt="table")],
                organize={"excludeByName": {"Time": True, "Value": True, "__name__": True}}),
          24, 6)
    return dashboard("uvmwatch-agent", "uvmwatch / Agent self-health",
                     "Is each uvmwatch agent scraped, are its probes attached, is it losing "
                     "events.", L)


DASHBOARDS = {
    "uvmwatch-fleet.json": fleet,
    "uvmwatch-cuinit.json": cuinit,
    "uvmwatch-ioctls.json": ioctls,
    "uvmwatch-agent.json": agent,
}


def render(fn):
    return json.dumps(fn(), indent=2, ensure_ascii=False) + "\n"


def main(argv):
    check = "--check" in argv
    stale = []
    for name, fn in DASHBOARDS.items():
        path = HERE / name
        text = render(fn)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale (run python3 dashboards/generate.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
