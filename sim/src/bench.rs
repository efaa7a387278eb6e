//! Placeholder, filled in below.
/// Bench options.
#[derive(Debug, Clone, Default)]
pub struct BenchOptions;
/// Bench report.
#[derive(Debug, Clone, Default)]
pub struct BenchReport;
/// Runs the bench.
pub async fn bench(_o: BenchOptions) -> Result<BenchReport, crate::SimError> {
    Ok(BenchReport)
}
