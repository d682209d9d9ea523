"""The retriever's losses over a batch's questions and passages: FiD-KD's distillation
(Izacard & Grave 2021, https://arxiv.org/abs/2012.04584: KL(teacher || student) of each
question's passage distribution) and EMDR2 (Sachan et al. 2021, as Atlas trains its retriever),
each optionally with the batch's other passages as in-batch negatives.

Shapes: B questions, P the batch's passages (question by question), D embedding width.
"""

from __future__ import annotations

import torch


def distillation_loss(
    question_embeddings: torch.Tensor,
    passage_embeddings: torch.Tensor,
    owner: torch.Tensor,
    teacher: torch.Tensor,
    reader_temperature: float,
    retriever_temperature: float,
    in_batch_negatives: bool,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """KL(teacher || student) of each question's passage distribution.

    Args:
        question_embeddings: (B, D).
        passage_embeddings: (P, D), the batch's passages, question by question.
        owner: (P,) the question index of each passage.
        teacher: (P,) reader scores.
        reduction: "batchmean" sums each question's KL over its passages and averages over
            the questions; "mean" divides that sum by the number of (question, own passage)
            pairs instead, as `torch.nn.KLDivLoss()` (reduction 'mean', ÷ B·N) does in the
            original: N times smaller for N passages per question.

    Returns:
        A scalar loss.
    """
    B = question_embeddings.shape[0]
    log_student, own = _student_log_probs(
        question_embeddings, passage_embeddings, owner, retriever_temperature, in_batch_negatives
    )
    teacher_logits = (teacher / reader_temperature).float()[None, :].expand(B, -1)
    target = teacher_logits.masked_fill(~own, float("-inf")).softmax(dim=-1)  # 0 off own
    # xlogy: 0 * log 0 = 0 where the teacher gives no mass.
    kl = torch.xlogy(target, target) - target * log_student.masked_fill(~own, 0.0)
    if reduction == "mean":
        return kl.sum() / own.sum()
    return kl.sum(dim=-1).mean()


def _student_log_probs(
    question_embeddings: torch.Tensor,
    passage_embeddings: torch.Tensor,
    owner: torch.Tensor,
    retriever_temperature: float,
    in_batch_negatives: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) log-softmax of the retriever's scores over each question's passages (or the
    whole batch's, with in-batch negatives), and the (B, P) mask of each question's own."""
    B, D = question_embeddings.shape
    # (B, P) student logits in fp32 even under autocast (bf16 rounds |logit| 8-16 to steps of
    # 0.0625), scaled as in the original: q . p / sqrt(D).
    with torch.autocast(question_embeddings.device.type, enabled=False):
        logits = question_embeddings.float() @ passage_embeddings.float().T
    logits = logits / D**0.5 / retriever_temperature
    own = owner[None, :] == torch.arange(B, device=owner.device)[:, None]  # (B, P)
    if not in_batch_negatives:
        logits = logits.masked_fill(~own, float("-inf"))
    return logits.float().log_softmax(dim=-1), own


def emdr2_loss(
    question_embeddings: torch.Tensor,
    passage_embeddings: torch.Tensor,
    owner: torch.Tensor,
    answer_log_likelihoods: torch.Tensor,
    retriever_temperature: float,
    in_batch_negatives: bool,
) -> torch.Tensor:
    """EMDR2 (Sachan et al. 2021; Atlas's formulation): the retrieved passage as a latent
    variable, -log sum_k p_retriever(k | q) p_reader(a | q, k), averaged over the questions.

    Args:
        answer_log_likelihoods: (P,) log p(answer | question, passage) of each passage for its
            own question (PDist's scores); data, so no gradient reaches the reader. With
            in-batch negatives, other questions' passages take retriever probability mass but
            add no likelihood.

    Returns:
        A scalar loss.
    """
    log_student, own = _student_log_probs(
        question_embeddings, passage_embeddings, owner, retriever_temperature, in_batch_negatives
    )
    # (B, P) log p_retriever(k | q) + log p_reader(a | q, k), on the question's own passages
    joint = (log_student + answer_log_likelihoods.float()[None, :]).masked_fill(~own, float("-inf"))
    return -torch.logsumexp(joint, dim=-1).mean()
