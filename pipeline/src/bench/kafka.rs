//! `engram bench kafka`: source throughput through a real broker.

use std::process::ExitCode;

use super::BenchArgs;

#[cfg(not(feature = "kafka"))]
pub(super) fn kafka_bench(_args: &BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("built without the kafka feature")
}

#[cfg(feature = "kafka")]
pub(super) fn kafka_bench(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    use connectors::{FileSource, Source, SourceBatch};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use std::time::{Duration, Instant};
    let inputs = super::input_paths(args);
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for p in &inputs {
        let text = std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        lines.extend(text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec));
    }
    let n = lines.len();
    let topic = format!("engram-bench-{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut cc = rdkafka::ClientConfig::new();
    cc.set("bootstrap.servers", &args.brokers);
    let admin: AdminClient<DefaultClientContext> = cc.create()?;
    for r in
        rt.block_on(admin.create_topics(&[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))], &AdminOptions::new()))?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    let producer: ThreadedProducer<DefaultProducerContext> = cc.clone().set("linger.ms", "20").create()?;
    let started = Instant::now();
    let keys: Vec<String> = lines
        .iter()
        .map(|l| {
            serde_json::from_slice::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["space"].as_str().map(str::to_string))
                .unwrap_or_else(|| "bench".into())
        })
        .collect();
    for (l, key) in lines.iter().zip(&keys) {
        let mut rec = BaseRecord::to(&topic).key(key.as_str()).payload(l.as_slice());
        while let Err((_, r)) = producer.send(rec) {
            rec = r;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let produce = started.elapsed().as_secs_f64();
    let drain = |mut src: Box<dyn Source>| -> anyhow::Result<f64> {
        let started = Instant::now();
        let mut got = 0;
        while got < n {
            match src.poll(20_000)? {
                SourceBatch::Records(r) => got += r.len(),
                SourceBatch::Idle => std::thread::sleep(src.idle_wait()),
                SourceBatch::Done => break,
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "read {got} of {n} records in 10 minutes");
        }
        Ok(started.elapsed().as_secs_f64())
    };
    let kafka = drain(Box::new(
        connectors::kafka::KafkaSource::new(
            &args.brokers,
            &format!("{topic}-g"),
            std::slice::from_ref(&topic),
            connectors::kafka::Share::ALL,
            &Default::default(),
            None,
        )
        .map_err(|e| anyhow::anyhow!(e))?,
    ))?;
    let file = if inputs.len() == 1 { Some(drain(Box::new(FileSource::new(&inputs[0], false)))?) } else { None };
    let row = serde_json::json!({"bench": "kafka", "records": n, "produce_per_second": n as f64 / produce,
        "kafka_source_per_second": n as f64 / kafka, "file_source_per_second": file.map(|f| n as f64 / f)});
    println!("{}", if args.json { row.to_string() } else { serde_json::to_string_pretty(&row)? });
    Ok(ExitCode::SUCCESS)
}
