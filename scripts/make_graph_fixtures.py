#!/usr/bin/env python3
"""Generate graph fixtures for the clustering-quality tests.

Writes one JSON file per graph into operators/tests/fixtures/graphs/ with the
graph (string node ids, weighted undirected edges) and reference results from
networkx: semi-synchronous label propagation, asynchronous label propagation
(seed 42) and the modularity of greedy modularity maximisation.

networkx is not a project dependency; rerun with a throwaway venv:

    python3 -m venv /tmp/nxenv
    /tmp/nxenv/bin/pip install networkx==3.3
    /tmp/nxenv/bin/python scripts/make_graph_fixtures.py

Each source graph is first relabelled to ids "n" + zero-padded integer (so
string order equals numeric order) and rebuilt with nodes and edges inserted
in sorted order; every algorithm runs on that canonical graph, so the
reference results can be reproduced from the fixture file alone.
"""

import json
import math
from pathlib import Path

import networkx as nx
from networkx.algorithms import community as nxc

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "operators" / "tests" / "fixtures" / "graphs"

ASYN_SEED = 42


def node_id(i, width):
    return "n" + str(i).zfill(width)


def canonical(nodes, edges):
    """Graph with nodes/edges inserted in sorted order (stable iteration)."""
    g = nx.Graph()
    g.add_nodes_from(sorted(nodes))
    for u, v, w in sorted(edges):
        g.add_edge(u, v, weight=w)
    return g


def relabel(g, order, weight_fn):
    """Map nodes of g (in the given order) to n-ids; return nodes, edges, mapping."""
    width = max(3, len(str(len(order) - 1)))
    mapping = {old: node_id(i, width) for i, old in enumerate(order)}
    edges = []
    for u, v, data in g.edges(data=True):
        assert u != v, "self-loop"
        a, b = sorted((mapping[u], mapping[v]))
        edges.append([a, b, float(weight_fn(u, v, data))])
    edges.sort()
    nodes = sorted(mapping.values())
    return nodes, edges, mapping


def sorted_communities(comms):
    return sorted(sorted(c) for c in comms)


def modularity(g, comms):
    return round(nxc.modularity(g, comms, weight="weight"), 6)


def build(name, source, g, order, weight_fn, labels=False):
    nodes, edges, mapping = relabel(g, order, weight_fn)
    cg = canonical(nodes, edges)

    lpa = sorted_communities(nxc.label_propagation_communities(cg))
    asyn = sorted_communities(nxc.asyn_lpa_communities(cg, weight="weight", seed=ASYN_SEED))
    greedy = nxc.greedy_modularity_communities(cg, weight="weight")

    out = {
        "name": name,
        "source": source,
        "networkx_version": nx.__version__,
        "nodes": nodes,
        "edges": edges,
    }
    if labels:
        out["labels"] = {new: str(old) for old, new in mapping.items()}
    out["networkx_lpa"] = {"communities": lpa, "modularity": modularity(cg, lpa)}
    out["networkx_asyn_lpa"] = {"communities": asyn, "modularity": modularity(cg, asyn)}
    out["networkx_greedy_modularity"] = {"modularity": modularity(cg, greedy)}
    return out


def unit(_u, _v, _d):
    return 1.0


def graphs():
    g = nx.karate_club_graph()
    yield build(
        "karate",
        "nx.karate_club_graph(); all edge weights set to 1.0",
        g, sorted(g.nodes()), unit,
    )

    g = nx.les_miserables_graph()
    yield build(
        "les_miserables",
        "nx.les_miserables_graph() with its edge weights; names mapped to ids "
        "in sorted name order (see labels)",
        g, sorted(g.nodes()), lambda u, v, d: d["weight"], labels=True,
    )

    g = nx.planted_partition_graph(4, 25, 0.35, 0.02, seed=7)
    yield build(
        "planted_4x25",
        "nx.planted_partition_graph(4, 25, 0.35, 0.02, seed=7); weight 1.0",
        g, sorted(g.nodes()), unit,
    )

    g = nx.planted_partition_graph(8, 12, 0.5, 0.01, seed=11)
    yield build(
        "planted_8x12",
        "nx.planted_partition_graph(8, 12, 0.5, 0.01, seed=11); weight 1.0",
        g, sorted(g.nodes()), unit,
    )

    # Rewiring in relaxed_caveman_graph can create self-loops (two with this
    # seed); fixtures hold only u < v edges, so drop them.
    g = nx.relaxed_caveman_graph(6, 8, 0.1, seed=3)
    g.remove_edges_from(list(nx.selfloop_edges(g)))
    yield build(
        "caveman_6x8",
        "nx.relaxed_caveman_graph(6, 8, 0.1, seed=3); self-loops removed; weight 1.0",
        g, sorted(g.nodes()), unit,
    )

    radius = 0.13
    g = nx.random_geometric_graph(150, radius, seed=5)
    pos = nx.get_node_attributes(g, "pos")

    def geo_weight(u, v, _d):
        return max(0.05, round(1 - math.dist(pos[u], pos[v]) / radius, 4))

    yield build(
        "random_geometric_150",
        "nx.random_geometric_graph(150, 0.13, seed=5); "
        "weight = max(0.05, round(1 - distance/0.13, 4))",
        g, sorted(g.nodes()), geo_weight,
    )


def write_compact(path, obj):
    """JSON with one edge / community per line: small but diff-friendly."""
    lines = ["{"]
    items = list(obj.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key in ("nodes",):
            body = json.dumps(value)
        elif key == "edges":
            body = "[\n" + ",\n".join("    " + json.dumps(e) for e in value) + "\n  ]"
        elif key in ("networkx_lpa", "networkx_asyn_lpa"):
            comms = ",\n".join("      " + json.dumps(c) for c in value["communities"])
            body = (
                '{\n    "communities": [\n' + comms + "\n    ],\n"
                '    "modularity": ' + json.dumps(value["modularity"]) + "\n  }"
            )
        elif key == "labels":
            body = "{\n" + ",\n".join(
                "    " + json.dumps(k) + ": " + json.dumps(v) for k, v in value.items()
            ) + "\n  }"
        else:
            body = json.dumps(value)
        lines.append("  " + json.dumps(key) + ": " + body + comma)
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == obj
    path.write_text(text)


def main():
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for g in graphs():
        path = OUT_DIR / (g["name"] + ".json")
        write_compact(path, g)
        print(
            f'{g["name"]}: {len(g["nodes"])} nodes, {len(g["edges"])} edges, '
            f'lpa Q={g["networkx_lpa"]["modularity"]} '
            f'({len(g["networkx_lpa"]["communities"])} comms), '
            f'asyn Q={g["networkx_asyn_lpa"]["modularity"]}, '
            f'greedy Q={g["networkx_greedy_modularity"]["modularity"]}'
        )


if __name__ == "__main__":
    main()
