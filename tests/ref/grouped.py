"""The grouped GEMM's size rules (csrc/core/gemm/grouped_gemm.h), spelled out: group g owns the rows after the previous
groups', a negative size counts as 0, the sizes are cut at m_total, and the rows past the last group are zeros."""


def grouped_rows(sizes, m_total):
    """([(group, first row, end row)], end of the covered rows)."""
    out, row = [], 0
    for g, s in enumerate(sizes):
        first = min(row, m_total)
        end = min(first + max(int(s), 0), m_total)
        out.append((g, first, end))
        row = end
    return out, row
