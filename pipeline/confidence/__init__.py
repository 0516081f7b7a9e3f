"""Word- and segment-level confidence of every decoder kind, calibrated to P(correct).

- measures: per-token confidence from a distribution (the decoder's probability of the
  emitted token; the normalised max-probability and Gibbs / Tsallis / Rényi entropy
  measures of "Fast Entropy-Based Methods of Word-Level Confidence Estimation for End-to-End
  Automatic Speech Recognition");
- scores: token distributions of the final tokens (teacher-forced attention decoder pass,
  CTC frames, transducer joint);
- words: words of a segment (one place; timings where the decoder has them), tokens mapped
  to words, aggregation (mean / min / product), edit-distance agreement of two texts and the
  N-best posterior of a beam decoder;
- calibration: the fitted map (logistic regression, then isotonic where it pays) stored as JSON and
  applied with numpy (fitting, with scikit-learn, is `shardscribe calibrate`);
- apply: fills ``confidence`` of words, segments and rows;
- evaluation: labels against references and the metrics (AUC, NCE, ECE).
"""
