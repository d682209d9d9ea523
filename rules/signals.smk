"""Distillation signals compared (config key distillation_signals): in the last round, each named
signal scores the round's lists with its own score_passages knobs (e.g. mode: pdist), distills a
retriever from the round's start with its own retriever knobs (e.g. objective: emdr2), embeds,
indexes and retrieves with it like any dense source (rules/retrieval.smk, source iter{i}-{name});
the report compares each with the round's own retriever, question by question.

REQUIRED INPUTS: the round's reader and lists (reader.smk), stage configs, the round's own
retrieved lists (retrieval.smk).
OUTPUTS:
    results/{run}/iter{i}-{signal}/scores/{split}.json     rule score_passages_signal
    results/{run}/iter{i}-{signal}-seed{seed}/retriever/model/  rule train_retriever_signal
    results/{run}/report/signals.{csv,html,png}, signals_plot.html  rule report_signals
    state/{run}/iter{i}-{signal}-seed{seed}/retriever/<key>/    training state (not an output)
"""

# The report's cut-offs: top-1/5/20, or the lists' length where they are shorter.
SIGNAL_KS = [k for k in (1, 5, 20) if k < knob("retrieve", "top_k")]
SIGNAL_KS.append(min(20, knob("retrieve", "top_k")))


# Both run their rule's command on the signal's stage file (scoring_config, training_inputs).
use rule score_passages as score_passages_signal with:
    output:
        "results/{run}/iter{i}-{signal}/scores/{split}.json",
    log:
        "logs/score_passages_signal/{run}/iter{i}-{signal}/{split}.log",
    benchmark:
        "logs/benchmarks/score_passages_signal/{run}/iter{i}-{signal}/{split}.tsv"
    wildcard_constraints:
        i=str(SIGNAL_ROUND),
        signal="|".join(SIGNALS) or "^$",


# One per seed of distillation_seeds (stage file retriever_signal_{signal}_seed{seed}), each a
# retrieval source of its own (iter{i}-{signal}-seed{seed}), from the signal's one set of scores.
use rule train_retriever as train_retriever_signal with:
    output:
        directory("results/{run}/iter{i}-{signal}-seed{seed}/retriever/model"),
    log:
        "logs/train_retriever_signal/{run}/iter{i}-{signal}-seed{seed}.log",
    benchmark:
        "logs/benchmarks/train_retriever_signal/{run}/iter{i}-{signal}-seed{seed}.tsv"
    wildcard_constraints:
        i=str(SIGNAL_ROUND),
        signal="|".join(SIGNALS) or "^$",
        seed="|".join(map(str, SIGNAL_SEEDS)) or "^$",
    params:
        init=lambda wc: start("retriever", int(wc.i))[0],
        # fid finds (or starts) the run's state under it: state/.../<key>/ (not an output)
        state_root="state/{run}/iter{i}-{signal}-seed{seed}/retriever",
        passages=passages_flag(),


rule report_signals:
    input:
        own=[retrieval(f"iter{SIGNAL_ROUND}", s) for s in EVAL_SPLITS],
        signals=[retrieval(src, s) for src in SIGNAL_SOURCES for s in EVAL_SPLITS],
        config=stage_file("eval_retrieval"),
        store=list_store(),
    output:
        table="results/{run}/report/signals.csv",
        page=report(
            "results/{run}/report/signals.html",
            category="2. Retrieval",
            caption="report/signals.rst",
            labels={"page": "Distillation signals (table)"},
        ),
        plot="results/{run}/report/signals.png",
        plot_page=report(
            "results/{run}/report/signals_plot.html",
            category="2. Retrieval",
            caption="report/signals.rst",
            labels={"page": "Distillation signals (plot)"},
        ),
    log:
        "logs/report_signals/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        splits=EVAL_SPLITS,
        own=f"iter{SIGNAL_ROUND}",
        signals=list(SIGNALS),
        seeds=len(SIGNAL_SEEDS),
        # what each source learned from: (score_passages mode, retriever objective, control)
        teachers={
            f"iter{SIGNAL_ROUND}": teacher("score_passages", OWN_RETRIEVER),
            **{
                name: teacher(
                    f"score_passages_signal_{name}", f"retriever_signal_{name}"
                )
                for name in SIGNALS
            },
        },
        ks=SIGNAL_KS,
        caption=caption_text("signals"),
    script:
        "../workflow_scripts/report_signals.py"
